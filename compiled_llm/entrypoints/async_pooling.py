"""AsyncPoolingLLM: what AsyncLLM(...) builds for a pooling model, and the server's handle on
it. Requests run on a pool of threads (input checks, tokenization, /tokenize's encode and decode)
and meet in the engine's batcher, whose one thread runs concurrent requests' sequences together
(engine/pooling_batcher.py); the event loop keeps serving. AsyncRunnerMixin: AsyncLLM's side."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from compiled_llm.config import EngineArgs
from compiled_llm.engine.pooling_batcher import BatchingPoolingEngine
from compiled_llm.engine.pooling_engine import PoolingEngine
from compiled_llm.entrypoints.llm_pooling import PoolingMixin, check_no_lora
from compiled_llm.output.pooling_outputs import PoolingRequestOutput
from compiled_llm.pooling_params import PoolingParams

_REQUEST_THREADS = 16  # requests in flight at once: the ones beyond wait for a thread


class AsyncPoolingLLM(PoolingMixin):
    """LLM's embed/classify/score/encode awaited through run(), and vLLM's AsyncLLM.encode,
    over a PoolingEngine."""

    runner_type = "pooling"

    def __init__(self, args: EngineArgs) -> None:
        self.engine = BatchingPoolingEngine(PoolingEngine(args))
        self.tokenizer = self.engine.tokenizer
        self.max_model_len = self.engine.max_model_len
        self._thread = ThreadPoolExecutor(max_workers=_REQUEST_THREADS,
                                          thread_name_prefix="pooling-request")
        self._live: set[str] = set()  # encode's request ids in flight
        self.log_requests = False  # vLLM's enable_log_requests: nothing is logged here

    async def run(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Await one PoolingMixin method (embed, classify, score, encode: LLM's, returning a
        list) on a request thread."""
        loop = asyncio.get_running_loop()
        call = partial(getattr(PoolingMixin, method), self)
        return await loop.run_in_executor(self._thread, lambda: call(*args, **kwargs))

    async def encode(self, prompt: Any, pooling_params: PoolingParams | None, request_id: str,
                     lora_request: Any = None, trace_headers: Mapping[str, str] | None = None,
                     priority: int = 0, tokenization_kwargs: dict[str, Any] | None = None,
                     truncate_prompt_tokens: int | None = None,
                     reasoning_ended: bool | None = None) -> AsyncIterator[PoolingRequestOutput]:
        """vLLM's AsyncLLM.encode: yields the one finished PoolingRequestOutput of one prompt
        (pooling_params.task picks embed or classify, as LLM.encode's pooling_task), batched
        with concurrent requests. ValueError naming an argument this engine cannot honour
        (an adapter, trace_headers, a priority, tokenization_kwargs, reasoning_ended) or a
        request_id already in flight; truncate_prompt_tokens is vLLM 0.10's spelling."""
        _check_encode_args(prompt, pooling_params, lora_request, trace_headers, priority,
                           tokenization_kwargs, reasoning_ended)
        if request_id in self._live:
            raise ValueError(f"request_id {request_id!r} is already in use")
        params = pooling_params or PoolingParams()
        self._live.add(request_id)
        try:
            out = (await self.run("encode", [prompt], params, False, truncate_prompt_tokens,
                                  None, params.task))[0]
        finally:
            self._live.discard(request_id)
        out.request_id = request_id
        yield out

    async def generate(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        """vLLM's AsyncLLM.generate: a pooling model generates nothing (ValueError naming the
        runner; encode pools)."""
        raise ValueError("generate() needs a generative model (runner='generate'); this "
                         "AsyncLLM runs a pooling model (runner='pooling'): use encode()")
        yield  # an async generator, as vLLM's

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
    max_prompt_bytes, encode_text, decode), for the server's /tokenize and /detokenize."""

    def __init__(self, llm: AsyncPoolingLLM) -> None:
        self.llm, self.tokenizer = llm, llm.tokenizer
        self.max_model_len = llm.max_model_len
        self.max_prompt_bytes = llm.engine.inputs.max_prompt_bytes

    async def encode_text(self, text: str, name: str = "prompt", **kwargs: Any) -> list[int]:
        """Token ids of text (AsyncLLM.encode_text's contract): ValueError naming `name` for text
        that is not valid UTF-8 or is over max_prompt_bytes (checked before any tokenizer time
        is spent). kwargs go to tokenizer.encode."""
        if self.tokenizer is None:
            raise ValueError(f"{name}: a text prompt needs a tokenizer")
        self.llm.engine.inputs.check_text_prompt(text, name)
        return await self.llm.tokenizing(self.tokenizer.encode, text, **kwargs)

    async def decode(self, token_ids: list[int]) -> str:
        """The text of token_ids."""
        return await self.llm.tokenizing(self.tokenizer.decode, token_ids)


class AsyncRunnerMixin:
    """AsyncLLM's side of pooling: AsyncLLM(args) on a pooling model (runner pooling, or auto
    on a pooling architecture) builds an AsyncPoolingLLM, as vLLM's one AsyncLLM serves both;
    encode on a generative one is refused."""

    def __new__(cls, args: EngineArgs, *rest: Any, **kwargs: Any):
        from compiled_llm.engine.llm_engine import DEMO_MODEL
        from compiled_llm.engine.pooling_engine import resolve_runner

        if resolve_runner(args, str(args.model or DEMO_MODEL)) != "pooling":
            return super().__new__(cls)
        given = {**dict(zip(("observer", "core_endpoint"), rest, strict=False)), **kwargs}
        named = [name for name, value in given.items() if value is not None]
        if named:
            raise ValueError(f"{named[0]}: not supported with runner='pooling'")
        return AsyncPoolingLLM(args)

    async def encode(self, prompt: Any, pooling_params: PoolingParams | None, request_id: str,
                     *args: Any, **kwargs: Any) -> AsyncIterator[PoolingRequestOutput]:
        """vLLM's AsyncLLM.encode, for pooling models: ValueError naming the runner here."""
        raise ValueError("encode() needs a pooling model (runner='pooling'); this AsyncLLM "
                         "runs a generative model (runner='generate'): use generate()")
        yield  # an async generator, as vLLM's


def _check_encode_args(prompt: Any, pooling_params: Any, lora_request: Any,
                       trace_headers: Any, priority: int, tokenization_kwargs: Any,
                       reasoning_ended: Any) -> None:
    """ValueError naming an AsyncLLM.encode argument this engine cannot honour."""
    check_no_lora(lora_request)
    if pooling_params is not None and not isinstance(pooling_params, PoolingParams):
        raise ValueError("pooling_params must be a PoolingParams, got "
                         f"{type(pooling_params).__name__}")
    if isinstance(prompt, list) and not all(isinstance(t, int) for t in prompt):
        raise ValueError("prompt: encode takes one prompt (a str, token ids or a prompt dict)")
    refused = {"trace_headers": bool(trace_headers), "priority": priority != 0,
               "tokenization_kwargs": bool(tokenization_kwargs),
               "reasoning_ended": reasoning_ended is not None}
    for name, bad in refused.items():
        if bad:
            raise ValueError(f"{name}: not supported by a pooling AsyncLLM (no tracing, "
                             "scheduling priority, tokenizer options or reasoning here)")
