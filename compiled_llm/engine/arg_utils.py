"""vLLM's module path for engine arguments: EngineArgs, and AsyncEngineArgs (EngineArgs plus
vLLM's enable_log_requests, which AsyncLLM honours)."""

from __future__ import annotations

from dataclasses import dataclass

from compiled_llm.config import EngineArgs


@dataclass
class AsyncEngineArgs(EngineArgs):
    """EngineArgs for AsyncLLM, as vLLM spells them."""

    enable_log_requests: bool = False
    """Log each request's sampling parameters at INFO as AsyncLLM adds it."""


__all__ = ["EngineArgs", "AsyncEngineArgs"]
