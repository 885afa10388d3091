"""AsyncPoolingLLM: the server's handle on a pooling engine. Every engine call runs on one
thread of its own, one at a time (the engine is not thread-safe), so the event loop keeps
serving while a batch runs; each request's inputs are one batch."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from compiled_llm.config import EngineArgs
from compiled_llm.engine.pooling_engine import PoolingEngine
from compiled_llm.entrypoints.llm_pooling import PoolingMixin


class AsyncPoolingLLM(PoolingMixin):
    """embed/classify/score/encode as coroutines over a PoolingEngine."""

    runner_type = "pooling"

    def __init__(self, args: EngineArgs) -> None:
        self.engine = PoolingEngine(args)
        self.tokenizer = self.engine.tokenizer
        self.max_model_len = self.engine.max_model_len
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pooling-engine")

    async def run(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Await one PoolingMixin method (embed, classify, score, encode) on the engine thread."""
        loop = asyncio.get_running_loop()
        call = getattr(self, method)
        return await loop.run_in_executor(self._thread, lambda: call(*args, **kwargs))

    def shutdown(self) -> None:
        """Stop the engine thread and free the model (idempotent)."""
        self._thread.shutdown(wait=True)
        self.engine.shutdown()
