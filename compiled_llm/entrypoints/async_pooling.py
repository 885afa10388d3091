"""AsyncPoolingLLM: the server's handle on a pooling engine. Requests run on a pool of threads
(input checks, tokenization, /tokenize's encode and decode) and meet in the engine's batcher,
whose one thread runs concurrent requests' sequences together (engine/pooling_batcher.py); the
event loop keeps serving."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
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

    async def tokenizing(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """Await fn(*args, **kwargs), a call on the tokenizer, on a request thread, one
        tokenizer call at a time (the engine's tokenizing included)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._thread, lambda: self.engine.with_tokenizer(fn, *args, **kwargs))

    def shutdown(self) -> None:
        """Stop the request threads and the engine thread, and free the model (idempotent)."""
        self._thread.shutdown(wait=True)
        self.engine.shutdown()


class PoolingTokens:
    """AsyncLLM's tokenizing face over an AsyncPoolingLLM (tokenizer, max_model_len,
    max_prompt_bytes, encode, decode), for the server's /tokenize and /detokenize; the pooling
    engine's own encode is vLLM's pooling call, hence a face of its own."""

    def __init__(self, llm: AsyncPoolingLLM) -> None:
        self.llm, self.tokenizer = llm, llm.tokenizer
        self.max_model_len = llm.max_model_len
        self.max_prompt_bytes = llm.engine.inputs.max_prompt_bytes

    async def encode(self, text: str, name: str = "prompt", **kwargs: Any) -> list[int]:
        """Token ids of text (AsyncLLM.encode's contract): ValueError naming `name` for text
        that is not valid UTF-8 or is over max_prompt_bytes (checked before any tokenizer time
        is spent). kwargs go to tokenizer.encode."""
        if self.tokenizer is None:
            raise ValueError(f"{name}: a text prompt needs a tokenizer")
        self.llm.engine.inputs.check_text_prompt(text, name)
        return await self.llm.tokenizing(self.tokenizer.encode, text, **kwargs)

    async def decode(self, token_ids: list[int]) -> str:
        """The text of token_ids."""
        return await self.llm.tokenizing(self.tokenizer.decode, token_ids)
