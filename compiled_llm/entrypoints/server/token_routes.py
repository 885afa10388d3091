"""POST /tokenize (a prompt, or chat messages through the chat template) and /detokenize, in
vLLM's shapes, with --chat-template made the tokenizer's own: shared by the generate app and
the pooling app (vLLM serves them for every model)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from compiled_llm.entrypoints.server.errors import OpenAIError
from compiled_llm.entrypoints.server.openapi import errors
from compiled_llm.entrypoints.server.protocol import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from compiled_llm.entrypoints.server.serving import TokenServing


def set_chat_template(engine, template: str | None) -> None:
    """Make template (--chat-template) the tokenizer's own, so every chat render that is sent
    none uses it (a request's trusted chat_template still wins), as vLLM does."""
    if template is None:
        return
    if engine.tokenizer is None:
        raise ValueError("chat_template: needs a tokenizer (skip_tokenizer_init is set)")
    engine.tokenizer.chat_template = template


def add_token_routes(app: FastAPI, serving: TokenServing) -> None:
    """/tokenize and /detokenize over serving's engine; 404 for a model it does not serve,
    400 naming the field for a bad body."""

    @app.post("/tokenize", response_model=TokenizeResponse, responses=errors(400, 401, 404, 413))
    async def tokenize(req: TokenizeRequest) -> JSONResponse:
        serving.check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise OpenAIError(400, "give exactly one of prompt and messages", param="prompt")
        if req.messages is not None:
            # vLLM's chat form defaults add_special_tokens to false: the template writes them
            special = req.add_special_tokens and "add_special_tokens" in req.model_fields_set
            ids = await serving.encode_chat(req.messages, req.add_generation_prompt,
                                            req.chat_template_kwargs, req.tools,
                                            req.chat_template,
                                            continue_final_message=req.continue_final_message,
                                            add_special_tokens=special)
        else:
            ids = await serving.encode(req.prompt, req.add_special_tokens)
        body = {"tokens": ids, "count": len(ids), "max_model_len": serving.max_model_len}
        if req.return_token_strs:
            body["token_strs"] = serving.engine.tokenizer.convert_ids_to_tokens(ids)
        return JSONResponse(body)

    @app.post("/detokenize", response_model=DetokenizeResponse,
              responses=errors(400, 401, 404, 413))
    async def detokenize(req: DetokenizeRequest) -> JSONResponse:
        serving.check_model(req.model)
        if serving.engine.tokenizer is None:
            raise OpenAIError(400, "tokens: detokenizing needs a tokenizer "
                              "(skip_tokenizer_init is set)", param="tokens")
        vocab = len(serving.engine.tokenizer)
        bad = [t for t in req.tokens if not 0 <= t < vocab]
        if bad:
            raise OpenAIError(400, f"tokens must be ids in [0, {vocab}), got {bad[:5]}",
                              param="tokens")
        text = await serving.engine.decode(req.tokens)
        return JSONResponse({"prompt": text})
