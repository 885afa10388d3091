"""One AsyncLLM request's outputs as an async iterator (RequestStream), its CUMULATIVE view,
and the hooks that time requests (RequestObserver: the server's metrics implement them)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from compiled_llm.output.outputs import (
    CompletionOutput,
    RequestOutput,
    RequestStateStats,
    append_completion,
    merge_deltas,
)

if TYPE_CHECKING:
    from compiled_llm.entrypoints.async_llm import AsyncLLM


class RequestObserver:
    """Per-request timing hooks (the server's metrics implement them); all no-ops here."""

    def on_output(self, rid: str, new_tokens: int, first: bool, gap_s: float,
                  prompt_tokens: int = 0) -> None:
        """A request got new tokens, gap_s after its previous output (or its arrival); with
        the first, prompt_tokens: its prompt's tokens times its sequences (counted once)."""

    def on_finish(self, outcome: str, prompt_tokens: int, gen_tokens: int,
                  e2e_s: float) -> None:
        """A sequence ended (stop, length, abort or error) e2e_s after it arrived."""

    def on_request_end(self, summary: RequestSummary) -> None:
        """A request ended, all its sequences with it (once per request)."""


@dataclass
class RequestSummary:
    """A finished request as vLLM's per-request histograms see it: its n and max_tokens,
    its longest sequence, and seconds (None where unknown): waiting to be admitted (queue),
    from admission to its first token (prefill) and to its last (inference), and from its
    first token to its last (decode)."""

    n: int
    max_tokens: int | None
    max_gen_tokens: int
    decode_s: float | None
    queue_s: float | None = None
    prefill_s: float | None = None
    inference_s: float | None = None


_ABORTED = object()  # queued to wake a stream's consumer once the stream is aborted


class RequestStream:
    """The outputs of one request, as an async iterator; abort() ends it early."""

    def __init__(self, owner: AsyncLLM, request_id: str, arrival_time: float | None = None,
                 n: int = 1, max_tokens: int | None = None) -> None:
        """arrival_time: when the request arrived (time.time()); None: now. n and max_tokens:
        its parameters, for the metrics."""
        self.owner, self.request_id = owner, request_id
        self.n, self.max_tokens = n, max_tokens
        self.first_time: float | None = None
        self.scheduled_ts: float | None = None  # when the core first admitted it
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.finished = False
        self.arrival = time.monotonic()
        if arrival_time is not None:  # the latency clocks are monotonic
            self.arrival -= max(0.0, time.time() - arrival_time)
        self.last_time: float | None = None
        self.num_prompt_tokens = 0
        # per sequence (completion index): tokens so far and finish reason, for n > 1
        self.seq_tokens: dict[int, int] = {}
        self.seq_reasons: dict[int, str] = {}

    @property
    def num_gen_tokens(self) -> int:
        """Tokens generated so far, over every sequence."""
        return sum(self.seq_tokens.values())

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestOutput]:
        try:
            while True:
                # no local holds the item: an error's traceback holds this frame, and a local
                # holding that error would be a cycle that only the collector frees
                out = self._take(await self.queue.get())
                if out is None:  # aborted with no final output to give: it ends
                    return
                while not out.finished and not self.queue.empty():
                    out = merge_deltas(out, self._take(self.queue.get_nowait()))
                yield out
                if out.finished:  # the last output, an abort's included (vLLM's)
                    return
        finally:
            self.abort()

    def _take(self, item: tuple[float, RequestOutput | BaseException] | object
              ) -> RequestOutput | None:
        """The output an item carries; None for the abort wake-up; raises an error item."""
        if item is _ABORTED:
            return None
        stamp, out = item
        if self.finished and not isinstance(out, BaseException):
            return out  # after an abort by id: abort() counted the request already
        if isinstance(out, BaseException):
            self.finished = True
            self.owner._streams.pop(self.request_id, None)
            self.owner.observer.on_finish("error", self.num_prompt_tokens, self.num_gen_tokens,
                                          stamp - self.arrival)
            self._summarize()
            try:  # one error may fail many streams: none gets another consumer's frames
                raise out.with_traceback(None)
            finally:  # this frame is in the error's traceback: holding the error is a cycle
                out = item = None
        self._observe(stamp, out)
        return out

    def _observe(self, stamp: float, out: RequestOutput) -> None:
        prompt_tokens = len(out.prompt_token_ids)
        if out.metrics is not None:
            self.scheduled_ts = out.metrics.scheduled_ts
        if out.metrics is not None and out.metrics.token_steps is not None \
                and self.last_time is None:
            # FINAL_ONLY: the engine's token timeline
            self._observe_timeline(out.metrics, prompt_tokens)
        else:
            self._observe_delivery(stamp, sum(len(o.token_ids) for o in out.outputs),
                                   prompt_tokens)
        for seq in out.outputs:
            self.seq_tokens[seq.index] = self.seq_tokens.get(seq.index, 0) + len(seq.token_ids)
            if seq.finish_reason:
                self.seq_reasons[seq.index] = seq.finish_reason
        self.num_prompt_tokens = len(out.prompt_token_ids)
        if out.finished:
            self.finished = True
            self.owner._streams.pop(self.request_id, None)
            self._observe_finish(stamp, "error" if out.error else None)

    def _observe_delivery(self, stamp: float, new: int, prompt_tokens: int) -> None:
        """Time tokens by when they reached this stream (what a streaming client sees)."""
        if new:
            self._observe_tokens(stamp, new, prompt_tokens)

    def _observe_timeline(self, stats: RequestStateStats, prompt_tokens: int) -> None:
        """Time a FINAL_ONLY request's tokens by the steps that made them, not by its one
        output (which would make its time to first token its end-to-end latency)."""
        for stamp, tokens in stats.token_steps:
            self._observe_tokens(stamp, tokens, prompt_tokens)

    def _observe_tokens(self, stamp: float, new: int, prompt_tokens: int) -> None:
        """One output's tokens: the first (time to first token, and the prompt counted with
        it for every sequence), else one inter-token gap (vLLM: one per step)."""
        first = self.last_time is None
        gap = stamp - (self.arrival if first else self.last_time)
        if first:
            self.first_time = stamp
        self.owner.observer.on_output(self.request_id, new, first, gap,
                                      prompt_tokens * self.n if first else 0)
        self.last_time = stamp

    def _observe_finish(self, stamp: float, outcome: str | None) -> None:
        """Count each sequence as a finished request (vLLM counts n > 1 children apiece)."""
        e2e = stamp - self.arrival
        for index in sorted(self.seq_tokens) or [0]:
            reason = outcome or self.seq_reasons.get(index, "stop")
            self.owner.observer.on_finish(reason, self.num_prompt_tokens,
                                          self.seq_tokens.get(index, 0), e2e)
        self._summarize()

    def _summarize(self) -> None:
        first, last, admitted = self.first_time, self.last_time, self.scheduled_ts
        tokens = first is not None and last is not None
        summary = RequestSummary(self.n, self.max_tokens, max(self.seq_tokens.values(),
                                                              default=0),
                                 last - first if tokens else None)
        if admitted is not None:
            summary.queue_s = max(0.0, admitted - self.arrival)
            if tokens:
                summary.prefill_s, summary.inference_s = first - admitted, last - admitted
        self.owner.observer.on_request_end(summary)

    def abort(self, final_output: bool = False) -> None:
        """Abort the request if it is still running (idempotent, any thread). A consumer
        gets what was queued before, then, with final_output (an abort by id), the
        request's last output with finish_reason "abort", as vLLM's AsyncLLM gives it."""
        if not self.finished:
            self.finished = True
            self.owner._streams.pop(self.request_id, None)
            done = self.owner._submit(self.owner.engine.abort_request, self.request_id)
            if final_output:
                done.add_done_callback(self._queue_final)
            elif not self.loop.is_closed():
                self.loop.call_soon_threadsafe(self.queue.put_nowait, _ABORTED)
            self.owner.observer.on_finish("abort", self.num_prompt_tokens, self.num_gen_tokens,
                                          time.monotonic() - self.arrival)
            self._summarize()

    def _queue_final(self, done: concurrent.futures.Future) -> None:
        """Queue the aborted request's last output (the engine thread's answer), else the
        plain end: the consumer never waits for an output that will not come."""
        out = None if done.cancelled() or done.exception() else done.result()
        item = _ABORTED if out is None else (time.monotonic(), out)
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    def __del__(self) -> None:  # a stream dropped unread must not hold KV blocks
        if not self.finished:
            self.abort()


def put_all(items: list) -> None:
    """Queue each (stream, item) pair's item on its stream (on the streams' event loop); a
    streamed n > 1 request's outputs of one step (one per child that moved) as one item."""
    last, pending = None, None
    for stream, item in items:
        if stream is last and isinstance(item[1], RequestOutput) \
                and isinstance(pending[1], RequestOutput):
            # vLLM's collector merges the outputs its consumer has not read yet; merged here,
            # the metrics see one step, not one output per child
            pending = (item[0], merge_deltas(pending[1], item[1]))
            continue
        if last is not None:
            last.queue.put_nowait(pending)
        last, pending = stream, item
    if last is not None:
        last.queue.put_nowait(pending)


class CumulativeStream:
    """Presents a DELTA stream as CUMULATIVE outputs: each sequence an output carries comes
    whole (everything so far), as vLLM's CUMULATIVE outputs."""

    def __init__(self, stream: RequestStream) -> None:
        self.stream = stream

    def abort(self) -> None:
        """Abort the underlying request."""
        self.stream.abort()

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        # per sequence: all of it so far; an output shows (as vLLM's) the sequences it moved
        totals: dict[int, CompletionOutput] = {}
        prompt_logprobs = None  # the first delta's, on every output
        try:
            async for out in self.stream:
                for seq in out.outputs:
                    prev = totals.get(seq.index)
                    totals[seq.index] = seq if prev is None else append_completion(prev, seq)
                prompt_logprobs = out.prompt_logprobs or prompt_logprobs
                yield replace(out, outputs=[totals[seq.index] for seq in out.outputs],
                              prompt_logprobs=prompt_logprobs)
        finally:
            self.stream.abort()
