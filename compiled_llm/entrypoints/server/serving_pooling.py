"""The pooling endpoints: /v1/embeddings (OpenAI format: float or base64, dimensions for
Matryoshka models, usage), /pooling, /v1/score and /v1/rerank (Jina/Cohere shape, vLLM's
paths), and the refusals that name the runner: a pooling server's generation routes and a
generate server's pooling routes answer 400."""

from __future__ import annotations

import base64
import re
import time
import uuid

import numpy as np
from fastapi import FastAPI

from compiled_llm.entrypoints.async_pooling import AsyncPoolingLLM
from compiled_llm.entrypoints.server.errors import OpenAIError
from compiled_llm.entrypoints.server.openapi import errors
from compiled_llm.entrypoints.server.protocol_pooling import (
    EmbeddingRequest,
    RerankRequest,
    ScoreRequest,
)
from compiled_llm.pooling_params import PoolingParams

POOLING_PATHS = ("/v1/embeddings", "/pooling", "/v1/score", "/score", "/v1/rerank", "/rerank",
                 "/v2/rerank")
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/responses")
_FIELD = re.compile(r"^([a-z_0-9]+)\b")
_INPUT = {"prompt": "input", "prompt_token_ids": "input"}  # the engine's names -> OpenAI's


def refuse_runner_paths(app: FastAPI, paths: tuple[str, ...], runner: str) -> None:
    """POST on each path answers a 400 naming the runner the served model runs under."""
    other = "generate" if runner == "pooling" else "pooling"

    async def refuse():
        raise OpenAIError(400, f"runner: this server's model runs with runner='{runner}', "
                          f"which does not serve this endpoint (start the server with "
                          f"--runner {other})", param="runner", code="unsupported_runner")

    for path in paths:
        app.add_api_route(path, refuse, methods=["POST"], responses=errors(400),
                          include_in_schema=False)


def engine_error(exc: ValueError, renames: dict[str, str] | None = None) -> OpenAIError:
    """A 400 for the engine's ValueError; its leading field (renamed for the route) is param."""
    match = _FIELD.match(str(exc))
    field = match.group(1) if match else None
    field = (renames or {}).get(field, field)
    return OpenAIError(400, str(exc), param=field, code="invalid_value")


def usage(outputs) -> dict[str, int]:
    """OpenAI's usage object: prompt tokens are all the tokens a pooling request takes."""
    tokens = sum(len(o.prompt_token_ids) for o in outputs)
    return {"prompt_tokens": tokens, "total_tokens": tokens}


def encode_vector(vector: list[float], encoding_format: str) -> list[float] | str:
    """A vector as floats, or as base64 of little-endian float32 (what OpenAI's client reads)."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
    return vector


def pooling_params(**fields) -> PoolingParams:
    """PoolingParams of a request's fields; a 400 naming the field a value is wrong for."""
    try:
        return PoolingParams(**fields)
    except ValueError as exc:
        raise engine_error(exc) from None


def prompts_of(value) -> list:
    """OpenAI's `input` as prompts: texts as they are, token-id lists as prompt_token_ids."""
    items = [value] if isinstance(value, str) else list(value)
    if not items:
        raise OpenAIError(400, "input must not be empty", param="input", code="invalid_value")
    if all(isinstance(t, int) for t in items):
        return [{"prompt_token_ids": items}]
    return [t if isinstance(t, str) else {"prompt_token_ids": t} for t in items]


class ServingPooling:
    """The pooling handlers over one AsyncPoolingLLM."""

    def __init__(self, engine: AsyncPoolingLLM, model_name: str) -> None:
        self.engine, self.model_name = engine, model_name

    def check_model(self, name: str | None) -> None:
        """404 unless name is None or the served model's name."""
        if name is not None and name != self.model_name:
            raise OpenAIError(404, f"the model {name!r} does not exist; this server serves "
                              f"{self.model_name!r}", param="model", code="model_not_found")

    async def _call(self, method: str, *args, renames: dict[str, str] | None = None, **kw):
        try:
            return await self.engine.run(method, *args, **kw)
        except ValueError as exc:
            raise engine_error(exc, renames) from None

    def _envelope(self, kind: str, data: list[dict], outputs) -> dict:
        return {"id": f"{kind}-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                "model": self.model_name, "data": data, "usage": usage(outputs)}

    async def embeddings(self, req: EmbeddingRequest) -> dict:
        """/v1/embeddings: one embedding per input, OpenAI's list (no id or created)."""
        self.check_model(req.model)
        params = pooling_params(dimensions=req.dimensions, normalize=req.normalize,
                                truncate_prompt_tokens=req.truncate_prompt_tokens)
        outs = await self._call("embed", prompts_of(req.input), params, renames=_INPUT)
        data = [{"object": "embedding", "index": i,
                 "embedding": encode_vector(o.outputs.embedding, req.encoding_format)}
                for i, o in enumerate(outs)]
        return {"object": "list", "data": data, "model": self.model_name, "usage": usage(outs)}

    async def pooling(self, req: EmbeddingRequest) -> dict:
        """/pooling: the pooler's raw output per input (embeddings, or class probabilities)."""
        self.check_model(req.model)
        if req.dimensions is not None:
            raise OpenAIError(400, "dimensions: /pooling answers the pooler's output as it is; "
                              "use /v1/embeddings", param="dimensions", code="invalid_value")
        params = pooling_params(truncate_prompt_tokens=req.truncate_prompt_tokens)
        outs = await self._call("encode", prompts_of(req.input), params, renames=_INPUT)
        data = [{"object": "pooling", "index": i,
                 "data": encode_vector(o.outputs.data, req.encoding_format)}
                for i, o in enumerate(outs)]
        return self._envelope("pool", data, outs)

    async def score(self, req: ScoreRequest) -> dict:
        """/v1/score: one score per pair."""
        self.check_model(req.model)
        outs = await self._call("score", req.text_1, req.text_2,
                                truncate_prompt_tokens=req.truncate_prompt_tokens)
        data = [{"object": "score", "index": i, "score": o.outputs.score}
                for i, o in enumerate(outs)]
        return self._envelope("score", data, outs)

    async def rerank(self, req: RerankRequest) -> dict:
        """/v1/rerank: documents by relevance to the query, the top_n first."""
        self.check_model(req.model)
        if not req.documents:
            raise OpenAIError(400, "documents must not be empty", param="documents",
                              code="invalid_value")
        if req.top_n is not None and req.top_n < 1:
            raise OpenAIError(400, f"top_n must be >= 1, got {req.top_n}", param="top_n",
                              code="invalid_value")
        outs = await self._call("score", req.query, req.documents,
                                truncate_prompt_tokens=req.truncate_prompt_tokens,
                                renames={"text_1": "query", "text_2": "documents"})
        order = sorted(range(len(outs)), key=lambda i: -outs[i].outputs.score)
        results = [{"index": i, "relevance_score": outs[i].outputs.score,
                    **({"document": {"text": req.documents[i]}} if req.return_documents else {})}
                   for i in order[:req.top_n or len(order)]]
        tokens = usage(outs)["total_tokens"]
        return {"id": f"rerank-{uuid.uuid4().hex}", "model": self.model_name,
                "usage": {"total_tokens": tokens}, "results": results}


def add_pooling_routes(app: FastAPI, serving: ServingPooling) -> None:
    """The pooling endpoints, at vLLM's paths."""
    answers = errors(400, 401, 404, 413)

    @app.post("/v1/embeddings", responses=answers)
    async def embeddings(req: EmbeddingRequest):
        return await serving.embeddings(req)

    @app.post("/pooling", responses=answers)
    async def pooling(req: EmbeddingRequest):
        return await serving.pooling(req)

    async def score(req: ScoreRequest):
        return await serving.score(req)

    async def rerank(req: RerankRequest):
        return await serving.rerank(req)

    for path in ("/v1/score", "/score"):
        app.add_api_route(path, score, methods=["POST"], responses=answers)
    for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
        app.add_api_route(path, rerank, methods=["POST"], responses=answers)
