"""Routes vLLM's clients probe beyond the OpenAI API: GET /v1/models/{id} (an OpenAI 404 for
another id), GET /tokenizer_info (the tokenizer's config, as vLLM returns it: what lm-eval's
remote tokenizer reads), and GET /version."""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import FastAPI

import compiled_llm
from compiled_llm.entrypoints.server.errors import OpenAIError
from compiled_llm.entrypoints.server.openapi import errors
from compiled_llm.entrypoints.server.protocol import ModelCard
from compiled_llm.entrypoints.server.serving import Serving

# what a client needs to tokenize as the server does, present even when the tokenizer has none
_SPECIAL = ("bos_token", "eos_token", "pad_token", "unk_token")


def add_compat_routes(app: FastAPI, serving: Serving) -> None:
    """Add the routes; serving gives the model name, its context length and the tokenizer."""
    created = int(time.time())

    @app.get("/v1/models/{model_id:path}", responses=errors(400, 401, 404))
    async def retrieve_model(model_id: str) -> ModelCard:
        lora = serving.check_model(model_id)  # the base model, a served adapter, else 404
        return ModelCard(id=model_id, created=created, max_model_len=serving.max_model_len,
                         root=lora.lora_path if lora else serving.model_path,
                         parent=serving.model_name if lora else None)

    @app.get("/tokenizer_info", responses=errors(400, 401, 404))
    async def tokenizer_info() -> dict[str, Any]:
        tokenizer = serving.engine.tokenizer
        if tokenizer is None:
            raise OpenAIError(404, "this server runs without a tokenizer (skip_tokenizer_init)",
                              code="no_tokenizer")
        return tokenizer_config(tokenizer, serving.max_model_len)

    @app.get("/version", responses=errors(400))
    async def version() -> dict[str, str]:
        return {"version": compiled_llm.__version__}


def tokenizer_config(tokenizer: Any, max_model_len: int) -> dict[str, Any]:
    """The tokenizer's tokenizer_config.json as loaded (its init kwargs, special tokens as
    text), its class, the chat template the server renders with, and model_max_length capped
    at the served context length (what fits a request here)."""
    info = {key: _plain(value) for key, value in getattr(tokenizer, "init_kwargs", {}).items()}
    for name in _SPECIAL:
        info[name] = _plain(getattr(tokenizer, name, None))
    info["tokenizer_class"] = type(tokenizer).__name__
    info["chat_template"] = getattr(tokenizer, "chat_template", None)
    info["model_max_length"] = min(int(getattr(tokenizer, "model_max_length", max_model_len)),
                                   max_model_len)
    return info


def _plain(value: Any) -> Any:
    """value as JSON: AddedTokens as their text, containers walked, anything else as str."""
    if hasattr(value, "content") and not isinstance(value, (str, dict)):
        return value.content
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value
