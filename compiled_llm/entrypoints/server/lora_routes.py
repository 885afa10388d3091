"""LoRA adapters as served models: --lora-modules (name=path, or a JSON object with name, path
and base_model_name, as vLLM takes them) and the adapters loaded at run time, each a model id
a request's "model" selects; /v1/load_lora_adapter and /v1/unload_lora_adapter with vLLM's
bodies, routed only when VLLM_ALLOW_RUNTIME_LORA_UPDATING is set (vLLM's rule)."""

from __future__ import annotations

import asyncio
import json
import os
import re
from itertools import count

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel

from compiled_llm.entrypoints.server.errors import OpenAIError
from compiled_llm.entrypoints.server.openapi import errors
from compiled_llm.lora.registry import LoRARegistry
from compiled_llm.lora.request import LoRARequest

ENV_RUNTIME_UPDATES = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


class LoadLoRAAdapterRequest(BaseModel):
    """POST /v1/load_lora_adapter's body."""

    lora_name: str
    lora_path: str
    load_inplace: bool = False
    """vLLM's: replace the adapter already served under lora_name (here under a new id)."""


class UnloadLoRAAdapterRequest(BaseModel):
    """POST /v1/unload_lora_adapter's body (lora_int_id is accepted and not needed)."""

    lora_name: str
    lora_int_id: int | None = None


def parse_lora_module(text: str) -> tuple[str, str]:
    """(name, path) of one --lora-modules entry; ValueError naming lora_modules otherwise."""
    if text.lstrip().startswith("{"):
        try:
            entry = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"lora_modules: {text!r} is not valid JSON ({exc})") from None
        name, path = entry.get("name"), entry.get("path")
    else:
        name, _, path = text.partition("=")
    if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
        raise ValueError(f"lora_modules: {text!r} must be name=path or "
                         '{"name": ..., "path": ...}')
    return name, path


class ServedLoRAs:
    """The adapters this server serves by name, each checked to load before it is listed.
    Invariant: an id is never given twice (an adapter loaded again gets a new id), so the
    engine's slots and KV blocks never mix two adapters under one id."""

    def __init__(self, engine, base_name: str, modules: list[str] | None) -> None:
        llm_engine = engine.engine
        self.enabled = llm_engine.args.enable_lora
        self.base_name = base_name
        self.engine = engine
        self._checker = LoRARegistry(self.enabled, llm_engine.args.max_lora_rank,
                                     llm_engine.core.info.model_config)
        self._ids = count(1)
        self.adapters: dict[str, LoRARequest] = {}
        for text in modules or []:
            if not self.enabled:
                raise ValueError("lora_modules: needs --enable-lora")
            self._add(*parse_lora_module(text))

    def _add(self, name: str, path: str, replace: bool = False) -> LoRARequest | None:
        """Check and serve an adapter under name; the one it replaced (load_inplace), if any."""
        if name == self.base_name or (name in self.adapters and not replace):
            raise ValueError(f"lora_name: the adapter {name!r} has already been loaded (set "
                             "load_inplace to replace it)")
        lora = self._checker.check(LoRARequest(name, next(self._ids), path))
        old, self.adapters[name] = self.adapters.get(name), lora
        return old

    def get(self, name: str) -> LoRARequest | None:
        """The adapter served under name, or None."""
        return self.adapters.get(name)

    async def load(self, body: LoadLoRAAdapterRequest) -> PlainTextResponse:
        """Check and add an adapter: a 404 when lora_path does not exist (as vLLM), a 400
        naming the field when it does not load."""
        if not self.enabled:
            raise OpenAIError(400, "lora_name: LoRA is not enabled (--enable-lora)",
                              param="lora_name")
        if not os.path.exists(body.lora_path):  # vLLM: "No adapter found" is a 404
            raise OpenAIError(404, f"lora_path: No adapter found for {body.lora_path!r}",
                              param="lora_path", code="not_found")
        try:
            replaced = await asyncio.to_thread(self._add, body.lora_name, body.lora_path,
                                               body.load_inplace)
        except ValueError as exc:  # the message leads with the field: lora_path, max_lora_rank
            message = str(exc)  # "field: ..." or (LoRARequest's own checks) "field must ..."
            field = re.match(r"[A-Za-z_][\w.]*", message)
            raise OpenAIError(400, message, param=field[0] if field else None,
                              code="invalid_value") from None
        if replaced is not None:  # its running requests finish with it
            await self._forget(replaced)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added "
                                 "successfully.")

    async def unload(self, body: UnloadLoRAAdapterRequest) -> PlainTextResponse:
        """Stop serving an adapter (requests running with it finish with it); 404 if absent."""
        lora = self.adapters.pop(body.lora_name, None)
        if lora is None:
            raise OpenAIError(404, f"lora_name: the adapter {body.lora_name!r} is not loaded",
                              param="lora_name", code="model_not_found")
        await self._forget(lora)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed "
                                 "successfully.")

    async def _forget(self, lora: LoRARequest) -> None:
        """Drop an adapter no longer served from the checks (its id is never given again)."""
        self._checker.forget(lora.lora_int_id)
        inputs = self.engine.engine.inputs
        await self.engine.call(inputs.loras.forget, lora.lora_int_id)


def runtime_updates_allowed() -> bool:
    """Whether VLLM_ALLOW_RUNTIME_LORA_UPDATING is set (1 or true)."""
    return os.environ.get(ENV_RUNTIME_UPDATES, "").strip().lower() in ("1", "true")


def add_lora_routes(app: FastAPI, loras: ServedLoRAs) -> None:
    """The load/unload routes, when runtime updates are allowed."""
    if not runtime_updates_allowed():
        return

    @app.post("/v1/load_lora_adapter", responses=errors(400, 401))
    async def load_lora_adapter(body: LoadLoRAAdapterRequest):
        return await loras.load(body)

    @app.post("/v1/unload_lora_adapter", responses=errors(400, 401, 404))
    async def unload_lora_adapter(body: UnloadLoRAAdapterRequest):
        return await loras.unload(body)
