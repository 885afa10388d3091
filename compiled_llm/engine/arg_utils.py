"""vLLM's module path for engine arguments: EngineArgs, and AsyncEngineArgs, the same class
(AsyncLLM takes the EngineArgs that LLM takes)."""

from __future__ import annotations

from compiled_llm.config import EngineArgs

AsyncEngineArgs = EngineArgs

__all__ = ["EngineArgs", "AsyncEngineArgs"]
