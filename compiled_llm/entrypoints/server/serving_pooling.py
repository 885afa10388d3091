"""The pooling endpoints: /v1/embeddings (OpenAI format: float or base64, dimensions for
Matryoshka models, usage), /pooling, /classify, /v1/score and /v1/rerank (Jina/Cohere shape,
vLLM's paths), each counted in the server's metrics, and the refusals that name the runner: a
pooling server's generation routes and a generate server's pooling routes answer 400."""

from __future__ import annotations

import re
import time
import uuid

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from compiled_llm.entrypoints.async_pooling import AsyncPoolingLLM
from compiled_llm.entrypoints.server.errors import OpenAIError
from compiled_llm.entrypoints.server.metrics import ServerMetrics
from compiled_llm.entrypoints.server.openapi import errors
from compiled_llm.entrypoints.server.pooling_fields import (
    CHAT_INPUT,
    COMMON,
    INPUT,
    check_embed_dtype,
    encode_vector,
    require_input,
)
from compiled_llm.entrypoints.server.protocol_pooling import (
    ClassificationRequest,
    EmbeddingChat,
    EmbeddingRequest,
    PoolingBody,
    PoolingRequest,
    RerankRequest,
    ScoreRequest,
)
from compiled_llm.entrypoints.server.serving import TokenServing
from compiled_llm.entrypoints.server.unsupported import refuse_fields
from compiled_llm.pooling_params import PoolingParams

POOLING_PATHS = ("/v1/embeddings", "/pooling", "/classify", "/v1/score", "/score", "/v1/rerank",
                 "/rerank", "/v2/rerank")
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


def usage(outputs) -> dict:
    """vLLM's UsageInfo: prompt tokens are all the tokens a pooling request takes; the
    completion count (0) and prompt details (null) are there as vLLM serialises them."""
    tokens = sum(len(o.prompt_token_ids) for o in outputs)
    return {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
            "prompt_tokens_details": None}


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
    """The pooling handlers over one AsyncPoolingLLM; each input counts in metrics as one
    finished request (vLLM counts one engine request per input)."""

    def __init__(self, engine: AsyncPoolingLLM, model_name: str, metrics: ServerMetrics | None,
                 model_names: list[str], tokens: TokenServing) -> None:
        """tokens: the app's tokenization handlers, which render chat-style input."""
        self.engine, self.model_name, self.metrics = engine, model_name, metrics
        self.model_names = model_names or [model_name]  # every --served-model-name
        self.tokens = tokens

    def check_model(self, name: str | None) -> None:
        """404 unless name is None or one of the served model's names."""
        if name is not None and name not in self.model_names:
            raise OpenAIError(404, f"the model {name!r} does not exist; this server serves "
                              f"{self.model_name!r}", param="model", code="model_not_found")

    def _check(self, req: PoolingBody, table: dict) -> None:
        self.check_model(req.model)
        refuse_fields(req.model_extra, table)

    @property
    def task(self) -> str:
        """The model's pooling task, as vLLM names it: classify or embed."""
        return "classify" if self.engine.engine.can_classify else "embed"

    async def _call(self, method: str, *args, renames: dict[str, str] | None = None, **kw):
        start = time.perf_counter()
        try:
            outs = await self.engine.run(method, *args, **kw)
        except ValueError as exc:
            raise engine_error(exc, renames) from None
        if self.metrics is not None:
            elapsed = time.perf_counter() - start
            for out in outs:
                self.metrics.pooled(len(out.prompt_token_ids), elapsed)
        return outs

    def _envelope(self, kind: str, req: PoolingBody, data: list[dict], outputs) -> dict:
        return {"id": f"{kind}-{req.request_id or uuid.uuid4().hex}", "object": "list",
                "created": int(time.time()), "model": self.model_name, "data": data,
                "usage": usage(outputs)}

    async def embeddings(self, req: EmbeddingRequest) -> dict:
        """/v1/embeddings: one embedding per input, OpenAI's list with vLLM's id and created."""
        prompts = await self._embedding_prompts(req)
        check_embed_dtype(req.embed_dtype)
        params = pooling_params(dimensions=req.dimensions, normalize=req.normalize,
                                truncate_prompt_tokens=req.truncate_prompt_tokens)
        outs = await self._call("embed", prompts, params, renames=_INPUT)
        data = [{"object": "embedding", "index": i,
                 "embedding": encode_vector(o.outputs.embedding, req.encoding_format,
                                            req.embed_dtype, req.endianness)}
                for i, o in enumerate(outs)]
        return self._envelope("embd", req, data, outs)

    async def _embedding_prompts(self, req: EmbeddingRequest) -> list:
        """input's prompts, or with vLLM's chat form (messages) the rendered chat's ids."""
        extra = req.model_extra or {}
        if "messages" not in extra:
            self._check(req, INPUT)
            return prompts_of(require_input(req.input))
        if req.input is not None:
            raise OpenAIError(400, "messages: give input or messages, not both",
                              param="messages", code="invalid_value")
        self._check(req, CHAT_INPUT)
        try:
            chat = EmbeddingChat.model_validate(
                {key: extra[key] for key in EmbeddingChat.model_fields if key in extra})
        except ValidationError as exc:
            raise RequestValidationError(exc.errors()) from None
        ids = await self.tokens.encode_chat(
            chat.messages, chat.add_generation_prompt, chat.chat_template_kwargs, None,
            chat.chat_template, continue_final_message=chat.continue_final_message)
        return [{"prompt_token_ids": ids}]

    async def pooling(self, req: PoolingRequest) -> dict:
        """/pooling: the pooler's raw output per input (embeddings, or class probabilities)."""
        self._check(req, INPUT)
        prompts = prompts_of(require_input(req.input))
        check_embed_dtype(req.embed_dtype)
        if req.task is not None and req.task != self.task:
            raise OpenAIError(400, f"task: this model pools for task '{self.task}'; task "
                              f"{req.task!r} is not supported", param="task",
                              code="unsupported_field")
        if req.dimensions is not None:
            raise OpenAIError(400, "dimensions: /pooling answers the pooler's output as it is; "
                              "use /v1/embeddings", param="dimensions", code="invalid_value")
        params = pooling_params(truncate_prompt_tokens=req.truncate_prompt_tokens,
                                **self._pooling_options(req))
        outs = await self._call("encode", prompts, params, renames=_INPUT)
        data = [{"object": "pooling", "index": i,
                 "data": encode_vector(o.outputs.data.tolist(), req.encoding_format,
                                       req.embed_dtype, req.endianness)}
                for i, o in enumerate(outs)]
        return self._envelope("pool", req, data, outs)

    def _pooling_options(self, req: PoolingRequest) -> dict:
        """normalize for an embedding model, the activation for a classifier; a 400 naming
        the one set for the other kind of model."""
        named = req.activation_field()
        if self.task == "classify":
            if req.normalize is not None:
                raise OpenAIError(400, "normalize: this model is a classifier; normalize "
                                  "applies to embeddings", param="normalize",
                                  code="unsupported_field")
            return {"use_activation": req.wants_activation()}
        if named is not None:
            raise OpenAIError(400, f"{named}: this model is an embedding model; {named} "
                              "applies to classifiers", param=named, code="unsupported_field")
        return {"normalize": req.normalize}

    async def classify(self, req: ClassificationRequest) -> dict:
        """/classify: class probabilities, the top class's label (config.json's id2label)."""
        self._check(req, INPUT)
        prompts = prompts_of(require_input(req.input))
        if self.task != "classify":
            raise OpenAIError(400, "runner: this model has no classification head (a "
                              "*ForSequenceClassification checkpoint classifies); /classify "
                              "needs a classifier", param="runner", code="unsupported_runner")
        params = pooling_params(use_activation=req.wants_activation(),
                                truncate_prompt_tokens=req.truncate_prompt_tokens)
        outs = await self._call("classify", prompts, params, renames=_INPUT)
        labels = self.engine.engine.hf_config.get("id2label") or {}
        data = []
        for i, out in enumerate(outs):
            probs = out.outputs.probs
            top = max(range(len(probs)), key=probs.__getitem__)
            data.append({"index": i, "label": labels.get(str(top)), "probs": probs,
                         "num_classes": len(probs)})
        return self._envelope("classify", req, data, outs)

    async def score(self, req: ScoreRequest) -> dict:
        """/v1/score: one score per pair."""
        self._check(req, COMMON)
        outs = await self._call("score", req.text_1, req.text_2,
                                pooling_params=self._score_params(req))
        data = [{"object": "score", "index": i, "score": o.outputs.score}
                for i, o in enumerate(outs)]
        return self._envelope("score", req, data, outs)

    def _score_params(self, req: ScoreRequest | RerankRequest) -> PoolingParams:
        # the activation is a cross-encoder's sigmoid: cosine scores have none to leave out
        if req.activation_field() is not None and self.task != "classify":
            named = req.activation_field()
            raise OpenAIError(400, f"{named}: this model scores by cosine similarity; {named} "
                              "applies to cross-encoders", param=named, code="unsupported_field")
        return pooling_params(use_activation=req.wants_activation(),
                              truncate_prompt_tokens=req.truncate_prompt_tokens)

    async def rerank(self, req: RerankRequest) -> dict:
        """/v1/rerank: documents by relevance to the query, the top_n first."""
        self._check(req, COMMON)
        if not req.documents:
            raise OpenAIError(400, "documents must not be empty", param="documents",
                              code="invalid_value")
        if req.top_n is not None and req.top_n < 0:  # 0: every document, as vLLM
            raise OpenAIError(400, f"top_n must be >= 0, got {req.top_n}", param="top_n",
                              code="invalid_value")
        outs = await self._call("score", req.query, req.documents,
                                pooling_params=self._score_params(req),
                                renames={"text_1": "query", "text_2": "documents"})
        order = sorted(range(len(outs)), key=lambda i: -outs[i].outputs.score)
        results = [{"index": i, "relevance_score": outs[i].outputs.score,
                    **({"document": {"text": req.documents[i]}} if req.return_documents else {})}
                   for i in order[:req.top_n or len(order)]]
        tokens = usage(outs)["total_tokens"]
        return {"id": f"rerank-{req.request_id or uuid.uuid4().hex}", "model": self.model_name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}, "results": results}


async def counted(metrics: ServerMetrics | None, work):
    """Await a handler; a 4xx it raises counts as a rejected request."""
    try:
        return await work
    except OpenAIError as exc:
        if metrics is not None and 400 <= exc.status < 500:
            metrics.rejected()
        raise


def add_pooling_routes(app: FastAPI, serving: ServingPooling) -> None:
    """The pooling endpoints, at vLLM's paths."""
    answers, metrics = errors(400, 401, 404, 413), serving.metrics

    @app.post("/v1/embeddings", responses=answers)
    async def embeddings(req: EmbeddingRequest):
        return await counted(metrics, serving.embeddings(req))

    @app.post("/pooling", responses=answers)
    async def pooling(req: PoolingRequest):
        return await counted(metrics, serving.pooling(req))

    @app.post("/classify", responses=answers)
    async def classify(req: ClassificationRequest):
        return await counted(metrics, serving.classify(req))

    async def score(req: ScoreRequest):
        return await counted(metrics, serving.score(req))

    async def rerank(req: RerankRequest):
        return await counted(metrics, serving.rerank(req))

    for path in ("/v1/score", "/score"):
        app.add_api_route(path, score, methods=["POST"], responses=answers)
    for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
        app.add_api_route(path, rerank, methods=["POST"], responses=answers)
