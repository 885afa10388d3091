"""AsyncPoolingLLM: the server's handle on a pooling engine. Requests run on a pool of threads
(input checks, tokenization) and meet in the engine's batcher, whose one thread runs concurrent
requests' sequences together (engine/pooling_batcher.py); the event loop keeps serving."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from compiled_llm.config import EngineArgs
from compiled_llm.engine.pooling_batcher import BatchingPoolingEngine
from compiled_llm.engine.pooling_engine import PoolingEngine
from compiled_llm.entrypoints.llm_pooling import PoolingMixin

_REQUEST_THREADS = 16  # requests in flight at once: the ones beyond wait for a thread


class AsyncPoolingLLM(PoolingMixin):
    """embed/classify/score/encode as coroutines over a PoolingEngine."""

    runner_type = "pooling"

    def __init__(self, args: EngineArgs) -> None:
        self.engine = BatchingPoolingEngine(PoolingEngine(args))
        self.tokenizer = self.engine.tokenizer
        self.max_model_len = self.engine.max_model_len
        self._thread = ThreadPoolExecutor(max_workers=_REQUEST_THREADS,
                                          thread_name_prefix="pooling-request")

    async def run(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Await one PoolingMixin method (embed, classify, score, encode) on a request thread."""
        loop = asyncio.get_running_loop()
        call = getattr(self, method)
        return await loop.run_in_executor(self._thread, lambda: call(*args, **kwargs))

    def shutdown(self) -> None:
        """Stop the request threads and the engine thread, and free the model (idempotent)."""
        self._thread.shutdown(wait=True)
        self.engine.shutdown()
