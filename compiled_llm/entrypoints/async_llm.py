"""AsyncLLM: the engine loop in a background thread, streamed to asyncio callers.

Every engine call (add, abort, step) runs on the loop thread, fed by a command queue, so the
engine needs no locks; tokenizing runs on a thread of its own. Outputs travel back per request
as DELTA outputs (only what is new, so a step's work is O(new tokens)), merged if they pile up.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from functools import partial
from typing import Any

from compiled_llm.config import EngineArgs
from compiled_llm.engine.core_client import EngineDeadError
from compiled_llm.engine.core_multi import CoreEndpoint
from compiled_llm.engine.inputs import check_prompt_keys, truncated_text_ids, with_text
from compiled_llm.engine.llm_engine import EngineStats, LLMEngine
from compiled_llm.entrypoints.async_info import AsyncInfoMixin
from compiled_llm.entrypoints.async_lora import AsyncLoRAMixin
from compiled_llm.entrypoints.async_pooling import AsyncRunnerMixin
from compiled_llm.entrypoints.request_stream import (
    CumulativeStream,
    RequestObserver,
    RequestStream,
    put_all,
)
from compiled_llm.output.outputs import RequestOutput
from compiled_llm.sampling_params import RequestOutputKind, SamplingParams

logger = logging.getLogger(__name__)
STEP_WAIT_S = 0.02  # longest the loop waits for a process core's outputs between commands
IDLE_WAKE_S = 0.1  # an idle loop refreshes the engine's stats this often


class AsyncLLM(AsyncLoRAMixin, AsyncInfoMixin, AsyncRunnerMixin):
    """An LLMEngine driven by a background thread; see the module docstring. The thread holds
    the engine until shutdown(). LoRA adapters: async_lora.py's calls; model_config,
    get_model_config and get_tokenizer: async_info.py's; a pooling model: async_pooling.py's."""

    _shut_down = False

    def __init__(self, args: EngineArgs, observer: RequestObserver | None = None,
                 core_endpoint: CoreEndpoint | None = None) -> None:
        """core_endpoint: attach to that shared engine core instead of starting one."""
        self.engine = LLMEngine(args, core_process=args.engine_core_process is not False,
                                core_endpoint=core_endpoint)
        self.tokenizer = self.engine.tokenizer
        self.max_model_len = self.engine.max_model_len
        self.max_prompt_bytes = self.engine.inputs.max_prompt_bytes
        # what requests leave unset, and the budget none may pass: the generation config's
        self.sampling_defaults = self.engine.sampling_defaults
        self.max_tokens_cap = self.engine.max_tokens_cap
        # vLLM's enable_log_requests: each request's params logged at INFO as it is added
        self.log_requests = bool(getattr(args, "enable_log_requests", False))
        self._tokenizer_pool = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="tokenizer")  # one thread: a fast tokenizer is not reentrant
        self.observer = observer or RequestObserver()
        self.stats: EngineStats = self.engine.get_stats()
        self.error: BaseException | None = None
        self._streams: dict[str, RequestStream] = {}
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        # the loop's heartbeat: when it last made progress, and whether it waits with no work
        self._beat, self._idle = time.monotonic(), True
        # the thread holds this object only within a turn of the loop, so a dropped AsyncLLM
        # (no shutdown) is collected, and its finalizer stops the loop and frees the engine
        self._thread = threading.Thread(target=_loop, args=(weakref.ref(self),),
                                        name="engine-loop", daemon=True)
        self._finalizer = weakref.finalize(self, _release, self._commands, self._thread,
                                           self.engine, self._tokenizer_pool)
        self._thread.start()

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs, start_engine_loop: bool = True,
                         usage_context: Any = None, stat_loggers: list | None = None,
                         enable_log_requests: bool = False, disable_log_stats: bool = False,
                         **kwargs: Any) -> AsyncLLM:
        """vLLM's constructor: an AsyncLLM over engine_args (an EngineArgs or AsyncEngineArgs).
        enable_log_requests (here or on AsyncEngineArgs) logs each request as it is added;
        usage_context and disable_log_stats change nothing (no stats are logged); ValueError
        for start_engine_loop=False or stat_loggers (this engine's loop always runs, and its
        metrics are the server's)."""
        if not start_engine_loop:
            raise ValueError("start_engine_loop=False is not supported: the engine loop "
                             "starts with the AsyncLLM")
        if stat_loggers:
            raise ValueError("stat_loggers are not supported")
        llm = cls(engine_args, **kwargs)
        llm.log_requests = llm.log_requests or enable_log_requests
        return llm

    # ------------------------------------------------------------------ caller side
    async def call(self, fn: Callable, *args: Any) -> Any:
        """Run fn(*args) on the engine thread, between steps, and return its result."""
        if self._shut_down:
            raise RuntimeError("engine is shut down")
        if self.error is not None:
            raise EngineDeadError(f"engine loop is dead: {self.error}")
        return await asyncio.wrap_future(self._submit(fn, *args))

    def stalled_for(self) -> float:
        """Seconds the engine loop has gone without progress while it has work (a command
        or an unfinished request); 0.0 while it waits idle. Read from any thread."""
        return 0.0 if self._idle else max(0.0, time.monotonic() - self._beat)

    async def encode_text(self, text: str, name: str = "prompt", **kwargs: Any) -> list[int]:
        """Token ids of text, off the engine thread and the event loop; ValueError naming
        `name` for text that is not valid UTF-8 or is over max_prompt_bytes (checked before
        any tokenizer time is spent). kwargs go to tokenizer.encode."""
        if self.tokenizer is None:
            raise ValueError(f"{name}: a text prompt needs a tokenizer")
        self.engine.inputs.check_text_prompt(text, name)
        return await asyncio.wrap_future(
            self._tokenizer_pool.submit(self.tokenizer.encode, text, **kwargs))

    async def decode(self, token_ids: list[int]) -> str:
        """The text of token_ids, off the engine thread and the event loop."""
        return await asyncio.wrap_future(self._tokenizer_pool.submit(self.tokenizer.decode,
                                                                     token_ids))

    def _submit(self, fn: Callable, *args: Any) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put((fn, args, fut))
        return fut

    async def add_request(self, request_id: str, prompt: Any,
                          params: SamplingParams | None = None,
                          arrival_time: float | None = None, lora_request=None,
                          tokenization_kwargs: dict[str, Any] | None = None,
                          trace_headers: Mapping[str, str] | None = None, priority: int = 0,
                          data_parallel_rank: int | None = None,
                          prompt_text: str | None = None) -> RequestStream:
        """Validate and queue; ValueError (nothing queued) on bad input. Iterate the result.
        vLLM's arguments: arrival_time (time.time()) starts the request's latency clock;
        lora_request: the LoRARequest the prompt runs with (None: the base model);
        tokenization_kwargs go to the tokenizer of a text prompt; priority needs
        scheduling_policy="priority"; prompt_text names a token prompt's text.
        trace_headers and a data_parallel_rank are refused (one engine, traced by the server)."""
        await self.check_health()  # a clear error, not the stopped tokenizer pool's
        _check_extras(trace_headers, data_parallel_rank, tokenization_kwargs)
        if request_id in self._streams:
            raise ValueError(f"request_id {request_id!r} is already in use")
        params = (params or SamplingParams(**self.sampling_defaults)).clone()
        user_kind = params.output_kind
        if user_kind == RequestOutputKind.CUMULATIVE:
            params.output_kind = RequestOutputKind.DELTA
        self.engine.inputs.check_params(params)  # refused before any tokenizer or grammar work
        prompt = await self._tokenized(with_text(prompt, prompt_text), tokenization_kwargs,
                                       params.truncate_prompt_tokens)
        grammar = self.engine.inputs.prepare_grammar(params)
        if grammar is not None:  # compiled off the engine thread; shield: others may share it
            await asyncio.shield(asyncio.wrap_future(grammar))
        if self.log_requests:
            logger.info("Received request %s: params: %s, lora_request: %s.", request_id,
                        params, lora_request)
        if request_id in self._streams:  # taken by a request added while this one awaited
            raise ValueError(f"request_id {request_id!r} is already in use")
        stream = RequestStream(self, request_id, arrival_time, params.n, params.max_tokens)
        self._streams[request_id] = stream
        try:
            await self.call(partial(self.engine.add_request, priority=priority,
                                    lora_request=lora_request, arrival_time=arrival_time),
                            request_id, prompt, params)
        except BaseException as exc:
            stream.finished = True
            self._streams.pop(request_id, None)
            if not isinstance(exc, ValueError):  # cancelled: the add may still run, and the
                self._submit(self.engine.abort_request, request_id)  # abort runs after it
            raise
        if user_kind == RequestOutputKind.CUMULATIVE:
            return CumulativeStream(stream)
        return stream

    async def _tokenized(self, prompt: Any, tokenization_kwargs: dict[str, Any] | None,
                         keep: int | None = None) -> Any:
        """A text prompt as {"prompt", "prompt_token_ids"}, tokenized here rather than on the
        engine thread, cut to `keep` tokens as the engine cuts a text prompt (its BOS kept);
        any other prompt as it is (the engine checks it). A dict key the engine does not read
        is refused here, before a rebuilt dict could drop it."""
        if isinstance(prompt, dict):
            check_prompt_keys(prompt)
        text = prompt.get("prompt") if isinstance(prompt, dict) else prompt
        if not isinstance(text, str) or isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            return prompt
        kwargs = tokenization_kwargs or {}
        ids = await self.encode_text(text, **kwargs)
        ids = truncated_text_ids(self.tokenizer, text, ids, keep, self.engine.inputs.max_model_len,
                                 kwargs.get("add_special_tokens", True))
        return {**prompt, "prompt_token_ids": ids} if isinstance(prompt, dict) else \
            {"prompt": text, "prompt_token_ids": ids}

    async def generate(self, prompt: Any, sampling_params: SamplingParams | None,
                       request_id: str, *, prompt_text: str | None = None, lora_request=None,
                       tokenization_kwargs: dict[str, Any] | None = None,
                       trace_headers: Mapping[str, str] | None = None, priority: int = 0,
                       data_parallel_rank: int | None = None) -> AsyncIterator[RequestOutput]:
        """Stream RequestOutputs (shaped by output_kind); cancelling aborts. The keyword
        arguments are add_request's (vLLM's AsyncLLM.generate)."""
        stream = await self.add_request(
            request_id, prompt, sampling_params, lora_request=lora_request,
            tokenization_kwargs=tokenization_kwargs, trace_headers=trace_headers,
            priority=priority, data_parallel_rank=data_parallel_rank, prompt_text=prompt_text)
        try:
            async for out in stream:
                yield out
        finally:  # the inner iterator is not closed with us: abort here, at once
            stream.abort()

    @property
    def is_running(self) -> bool:
        """Whether the engine loop takes requests (not shut down, not dead)."""
        return not self._shut_down and self.error is None

    @property
    def is_stopped(self) -> bool:
        """Whether shutdown() ran."""
        return self._shut_down

    @property
    def errored(self) -> bool:
        """Whether the engine loop died (its core failed)."""
        return self.error is not None

    @property
    def dead_error(self) -> BaseException:
        """The error requests get from a dead engine (vLLM's EngineDeadError)."""
        return EngineDeadError(f"engine loop is dead: {self.error}")

    async def check_health(self) -> None:
        """Raise EngineDeadError if the engine loop died, RuntimeError once shut down."""
        if self.error is not None:
            raise self.dead_error
        if self._shut_down:
            raise RuntimeError("engine is shut down")

    async def reset_prefix_cache(self, device: Any = None) -> bool:
        """Forget every cached block hash, between steps (vLLM's; True when done)."""
        await self.call(self.engine.reset_prefix_cache)
        return True

    async def abort(self, request_id: str | Iterable[str]) -> None:
        """Abort requests by id (one, or several as vLLM takes them) whose streams are open."""
        for rid in [request_id] if isinstance(request_id, str) else list(request_id):
            stream = self._streams.get(rid)
            if stream is not None:
                stream.abort(final_output=True)

    def shutdown(self) -> None:
        """Stop the loop thread, fail open streams and queued calls with "engine is shut
        down", then shut the engine down, freeing its device memory (idempotent)."""
        if self._shut_down:
            return
        self._shut_down = True
        self._finalizer.detach()
        self._tokenizer_pool.shutdown(wait=False, cancel_futures=True)
        self._commands.put(None)
        self._thread.join(timeout=30)
        error = RuntimeError("engine is shut down")
        self._fail_all(error)
        # call() now reports the shutdown; an error kept here would hold this object through
        # the frames in its traceback (the loop's, or a consumer's that raised it)
        self.error = None
        self._streams.clear()
        _fail_pending(self._commands, error)
        if self._thread.is_alive():  # a step still running: the engine is not ours to free
            logger.error("engine loop did not stop within 30 s; the engine is not shut down")
            return
        self.engine.shutdown()

    # ------------------------------------------------------------------ engine thread
    def _turn(self) -> bool:
        """One turn of the engine loop: queued commands, a step if there is work, the stats
        (an idle turn waits at most IDLE_WAKE_S for a command); False once the loop ends."""
        if not self._drain(block=not self.engine.has_unfinished_requests()):
            return False
        if self.engine.has_unfinished_requests():
            try:  # a process core: wake for commands at least every STEP_WAIT_S
                outs = self.engine.step(STEP_WAIT_S)
            except Exception as e:  # the engine state is unknown now: fail everyone
                logger.exception("engine step failed")
                self._fail_all(e)
                return False
            self._deliver(outs)
        self._beat = time.monotonic()
        return self._publish_stats()

    def _drain(self, block: bool) -> bool:
        """Run queued commands; False on shutdown."""
        self._idle = block
        try:  # an idle loop still wakes now and then: the core's load changes after aborts
            item = self._commands.get(block=block, timeout=IDLE_WAKE_S if block else None)
        except queue.Empty:
            return True
        while True:
            self._beat, self._idle = time.monotonic(), False
            if item is None:
                return False
            fn, args, fut = item
            # a caller cancelled before its command ran (a client that left) gets nothing
            # run, and a cancelled future must never see set_result: it would kill this loop
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(*args))
                except Exception as e:
                    fut.set_exception(e)
            try:
                item = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _deliver(self, outs: list[RequestOutput]) -> None:
        now = time.monotonic()
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for out in outs:
            stream = self._streams.get(out.request_id)
            if stream is not None:
                by_loop.setdefault(stream.loop, []).append((stream, (now, out)))
        for loop, items in by_loop.items():
            if not loop.is_closed():
                loop.call_soon_threadsafe(put_all, items)

    def _fail_all(self, error: BaseException) -> None:
        self.error = error
        now = time.monotonic()
        for stream in list(self._streams.values()):
            if not stream.loop.is_closed():
                stream.loop.call_soon_threadsafe(put_all, [(stream, (now, error))])

    def _publish_stats(self) -> bool:
        """Refresh the stats snapshot; False (everyone failed) when the core is found dead,
        which an idle loop learns here rather than from a step."""
        try:
            self.stats = self.engine.get_stats()
        except EngineDeadError as e:
            logger.error("engine core died: %s", e)
            self._fail_all(e)
            return False
        return True


def _loop(ref: weakref.ref) -> None:
    """The engine thread: turns of its AsyncLLM's loop, holding it only within a turn; ends
    on shutdown, on a dead engine, or once the AsyncLLM is gone."""
    while (owner := ref()) is not None and owner._turn():
        del owner  # between turns the caller's references alone keep it alive


def _release(commands: queue.SimpleQueue, thread: threading.Thread, engine: LLMEngine,
             tokenizer_pool: concurrent.futures.ThreadPoolExecutor) -> None:
    """Finalizer of an AsyncLLM dropped without shutdown(): stop its loop and free its engine
    (on the loop's own thread when that dropped the last reference, between turns)."""
    tokenizer_pool.shutdown(wait=False, cancel_futures=True)
    commands.put(None)
    if thread is not threading.current_thread():
        thread.join(timeout=30)
    _fail_pending(commands, RuntimeError("engine is shut down"))
    if thread is threading.current_thread() or not thread.is_alive():
        engine.shutdown()


def _fail_pending(commands: queue.SimpleQueue, error: BaseException) -> None:
    """Fail every call still queued after the loop stopped, so no caller waits forever."""
    while True:
        try:
            item = commands.get_nowait()
        except queue.Empty:
            return
        if item is not None and not item[2].done():  # a cancelled caller wants no answer
            item[2].set_exception(error)


def _check_extras(trace_headers: Mapping[str, str] | None, data_parallel_rank: int | None,
                  tokenization_kwargs: dict[str, Any] | None) -> None:
    """ValueError naming an add_request argument this engine cannot honour."""
    if trace_headers:
        raise ValueError("trace_headers: requests are not traced by AsyncLLM (the server "
                         "traces them: --otlp-traces-endpoint)")
    if data_parallel_rank not in (None, 0):
        raise ValueError(f"data_parallel_rank={data_parallel_rank!r}: this engine has one "
                         "data-parallel rank (0)")
    if tokenization_kwargs is not None and not isinstance(tokenization_kwargs, dict):
        raise ValueError("tokenization_kwargs must be a dict of tokenizer arguments")


# vLLM's name for the same engine (its V1 AsyncLLMEngine is AsyncLLM), so scripts that import
# it switch by changing the import
AsyncLLMEngine = AsyncLLM
