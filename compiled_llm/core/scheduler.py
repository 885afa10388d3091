"""Scheduler: decides each step which requests run and how many tokens each (pure Python).

Continuous batching under a token budget and a sequence cap, chunked prefill (decodes first),
prefix-cache hits on admission, fcfs or priority order, preemption by recompute when KV blocks
run out. The one writer of a request's status and the one place that decides it is finished.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from compiled_llm.config import SchedulerConfig
from compiled_llm.core.kv_cache_manager import KVCacheManager
from compiled_llm.core.request import Request, RequestStatus
from compiled_llm.core.request_queue import make_queue, victim_key

# what may replace a finish decided on the same step's token (an abort never is replaced)
_LATER_VERDICTS = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_ERROR)


@dataclass
class SchedulerOutput:
    """One step: requests with their new-token counts, in batch order."""

    scheduled: list[tuple[Request, int]] = field(default_factory=list)
    finished_req_ids: set[str] = field(default_factory=set)  # since the previous step
    preempted_req_ids: set[str] = field(default_factory=set)  # in this step's scheduling
    num_preempted: int = 0
    num_prefill_tokens: int = 0  # prompt (or recompute) tokens among the scheduled ones
    num_prefill_reqs: int = 0  # requests that computed such tokens

    @property
    def total_tokens(self) -> int:
        """New tokens over every scheduled request."""
        return sum(num_new for _, num_new in self.scheduled)

    @property
    def is_empty(self) -> bool:
        """Whether the step runs no request."""
        return not self.scheduled


class Scheduler:
    """Synchronous scheduling: a step's tokens are read before the next step is scheduled.

    Preemption picks the newest running request (under priority, the least urgent). A request
    finishes here on stop tokens, length or its grammar, and through `finish` on the stop
    strings and errors that output processing reports.
    """

    def __init__(self, cfg: SchedulerConfig, kv: KVCacheManager) -> None:
        self.cfg = cfg
        self.kv = kv
        self.waiting = make_queue(cfg.scheduling_policy)
        self._victim_key = victim_key(cfg.scheduling_policy)
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._finished_ids: set[str] = set()
        self._newly_finished: list[Request] = []  # to report, in finish order
        self.num_preemptions = 0
        self.max_loras = 0  # most adapters among running requests (0: no limit); the core sets it
        # most prefill tokens in a step with decodes (None: only the token budget); the core
        # sets it from StepCostModel when max_decode_slowdown is on
        self.prefill_cap: int | None = None
        self._prefill_room: int | None = None  # what is left of prefill_cap in this step

    def add_request(self, req: Request) -> None:
        """Queue a request; its prompt must fit max_model_len and the pool (checked here)."""
        if req.num_prompt_tokens >= self.cfg.max_model_len:
            raise ValueError(
                f"prompt is {req.num_prompt_tokens} tokens; max_model_len is "
                f"{self.cfg.max_model_len} (prompt plus at least one generated token)"
            )
        if not self.kv.can_ever_fit(req.num_prompt_tokens + 1):
            raise ValueError(f"prompt of {req.num_prompt_tokens} tokens can never fit the KV cache")
        self.requests[req.request_id] = req
        self.waiting.add(req)

    def has_unfinished(self) -> bool:
        """Whether any request is waiting or running."""
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        """The next step: running requests first, then admissions while budget and seats
        last (none in a step that had to preempt)."""
        out = SchedulerOutput(finished_req_ids=self._finished_ids)
        self._finished_ids = set()
        # without chunked prefill a prompt runs whole: no cap (it would hold the queue back)
        self._prefill_room = (self.prefill_cap if self.cfg.enable_chunked_prefill
                              and self._has_decodes() else None)
        budget = self._schedule_running(out, self.cfg.max_num_batched_tokens)
        if not out.num_preempted:
            self._schedule_waiting(out, budget)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        # decodes first, then ongoing prefill chunks: a long prompt never stalls token streams
        order = sorted(self.running, key=lambda req: req.num_tokens - req.num_computed_tokens > 1)
        for req in order:
            if budget <= 0:
                break
            if req.status is not RequestStatus.RUNNING:  # preempted earlier in this loop
                continue
            if req.num_pending and self._nothing_to_compute(req):  # (hot: test the field first)
                continue
            if req.long_rope_at is not None and req.num_computed_tokens >= req.long_rope_at:
                self._recompute_long_rope(req, out)
                continue
            num_new = self._num_new_tokens(req, budget)
            prompt = req.num_tokens - req.num_computed_tokens > 1  # a prompt's (or recompute's)
            if prompt:
                num_new = self._take_prefill(num_new)
                if not num_new:
                    continue
            if not self._allocate_or_preempt(req, num_new, out):
                continue
            out.scheduled.append((req, num_new))
            if prompt:
                _count_prefill(out, num_new)
            budget -= num_new
        return budget

    def _has_decodes(self) -> bool:
        """Whether a running request decodes (only asked with a prefill cap)."""
        return self.prefill_cap is not None and any(
            req.num_tokens - req.num_computed_tokens <= 1 for req in self.running)

    def _take_prefill(self, num_new: int) -> int:
        """num_new prompt tokens, cut to what the step's prefill room has left."""
        if self._prefill_room is None:
            return num_new
        num_new = min(num_new, self._prefill_room)
        self._prefill_room -= num_new
        return num_new

    def _num_new_tokens(self, req: Request, budget: int) -> int:
        """Tokens a running request computes this step (speculative decoding adds drafts)."""
        return min(req.num_tokens - req.num_computed_tokens, budget)

    def _lookahead(self, req: Request, num_new: int) -> int:
        """Slots past a step's tokens it also reserves (a draft model's proposals write them)."""
        return 0

    def _allocate_or_preempt(self, req: Request, num_new: int, out: SchedulerOutput) -> bool:
        while not self.kv.allocate_slots(req, num_new):
            scheduled = {id(other) for other, _ in out.scheduled}  # only on the rare failure path
            victims = [other for other in self.running if id(other) not in scheduled]
            if victims == [req] and not self.kv.can_ever_fit(req.num_computed_tokens + num_new):
                # alone and still too big: the pool, not the batch, is the limit
                self.finish(req, RequestStatus.FINISHED_LENGTH)
                return False
            victim = max(victims, key=self._victim_key)
            self.preempt(victim)
            out.preempted_req_ids.add(victim.request_id)
            out.num_preempted += 1
            if victim is req:
                return False
        return True

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            req = self.waiting.peek()
            hits = self.kv.get_computed_blocks(req)  # waiting requests hold no blocks
            left = req.num_tokens - len(hits) * self.kv.block_size
            num_new = min(left, budget)
            if self._prefill_room is not None:
                num_new = min(num_new, self._prefill_room)
            if not num_new or not self.cfg.enable_chunked_prefill and num_new < left:
                break
            if self.max_loras and not self._lora_fits(req):
                break  # its adapter would exceed max_loras: it waits for a slot
            if not self.kv.allocate_slots(req, num_new + self._lookahead(req, num_new), hits):
                break
            self.waiting.pop()
            self._take_prefill(num_new)
            req.status = RequestStatus.RUNNING
            if req.first_scheduled_time is None:  # its queue time ends (vLLM's metrics)
                req.first_scheduled_time = time.monotonic()
            self.running.append(req)
            out.scheduled.append((req, num_new))
            _count_prefill(out, num_new)
            budget -= num_new

    def _lora_fits(self, req: Request) -> bool:
        """Whether req's adapter is among the running ones or one more still fits max_loras."""
        if req.lora_request is None:
            return True
        running = {r.lora_request.lora_int_id for r in self.running if r.lora_request}
        return req.lora_request.lora_int_id in running or len(running) < self.max_loras

    def preempt(self, req: Request) -> None:
        """Free req's blocks (cached ones stay reusable) and requeue it, to be recomputed."""
        req.num_preemptions += 1
        self.num_preemptions += 1
        self._requeue(req)

    def _requeue(self, req: Request) -> None:
        self.running.remove(req)
        self.kv.free(req)
        req.num_computed_tokens = 0
        req.status = RequestStatus.PREEMPTED
        self.waiting.requeue(req)

    def _recompute_long_rope(self, req: Request, out: SchedulerOutput) -> None:
        """Its next position is LongRoPE's first long one: the whole sequence is recomputed
        with the long rows (transformers' Phi-3 drops its cache there), in a later step."""
        self._requeue(req)
        req.long_rope, req.long_rope_at, req.block_hashes = True, None, []
        out.preempted_req_ids.add(req.request_id)  # its table row is released
        out.num_preempted += 1

    def _nothing_to_compute(self, req: Request) -> bool:
        """Whether a running request has no token to compute this step (never, here)."""
        return False

    def advance(self, out: SchedulerOutput, sample_reqs: list[Request] = ()) -> None:
        """The step ran (or, under async scheduling, was launched): its tokens count as
        computed. sample_reqs, the step's sampling requests in row order, matter only to the
        async scheduler."""
        for req, num_new in out.scheduled:
            if not req.is_finished:  # finished (aborted) while the step ran
                req.num_computed_tokens += num_new

    def _token_landed(self, req: Request) -> None:
        """A sampled token of req reached the host (async bookkeeping; nothing here)."""

    def resolve(self, out: SchedulerOutput, sampled: dict[str, int]) -> list[Request]:
        """Append the step's sampled tokens and apply stop checks; returns the requests that
        got a new token. A request that finished meanwhile drops its token."""
        progressed = []
        for req, _ in out.scheduled:
            if req.is_finished:
                continue
            token = sampled.get(req.request_id)
            if token is None:
                continue
            if req.num_pending:  # only under async scheduling (hot: test the field first)
                self._token_landed(req)
            req.append_token(token)
            progressed.append(req)
            status, reason = self._check_stop(req, token)
            if status is None and req.grammar is not None:
                status, reason = self._check_grammar(req, token)
            if status is not None:
                self.finish(req, status, reason)
        return progressed

    def _check_grammar(self, req: Request, token: int) -> tuple[RequestStatus | None, None]:
        """Advance req's structured-output matcher: a rejected token fails the request, a
        terminated grammar ends it. A matcher that raises fails its request alone."""
        try:
            if not req.grammar.accept_token(token):
                req.error = "structured_outputs: a sampled token was rejected by the grammar"
                return RequestStatus.FINISHED_ERROR, None
            return (RequestStatus.FINISHED_STOPPED if req.grammar.is_terminated() else None), None
        except Exception as exc:  # the matcher is third-party code: contain it
            req.error = f"output processing failed: {type(exc).__name__}: {exc}"
            return RequestStatus.FINISHED_ERROR, None

    def _check_stop(self, req: Request, token: int) -> tuple[RequestStatus | None, int | None]:
        params, num_output = req.sampling_params, req.num_output_tokens
        if num_output >= params.min_tokens:
            if not params.ignore_eos and token in req.eos_token_ids:
                # vLLM: the primary EOS (the tokenizer's, first) has no stop_reason; the
                # model's other EOS ids are stop tokens, reported by id
                primary = req.tokenizer_eos and token == req.eos_token_ids[0]
                return RequestStatus.FINISHED_STOPPED, None if primary else token
            if token in params.stop_token_ids:
                return RequestStatus.FINISHED_STOPPED, token
        if params.max_tokens is not None and num_output >= params.max_tokens:
            return RequestStatus.FINISHED_LENGTH, None
        if len(req.all_token_ids) >= self.cfg.max_model_len:  # known tokens, not pending
            return RequestStatus.FINISHED_LENGTH, None
        return None, None

    def finish(self, req: Request, status: RequestStatus, reason: int | str | None = None,
               error: str | None = None) -> None:
        """End a request now (stop, length, abort, error) and return its blocks at once. A
        request that finished since the last schedule (on this step's token) and was not
        aborted takes the later verdict: a stop string or an error beats a length finish."""
        if error is not None and req.status is not RequestStatus.FINISHED_ABORTED:
            req.error = error
        if req.is_finished:
            if (status in _LATER_VERDICTS and req.request_id in self._finished_ids
                    and req.status is not RequestStatus.FINISHED_ABORTED):
                req.status, req.stop_reason = status, reason
            return
        req.status, req.stop_reason = status, reason
        req.grammar = None  # the matcher's memory goes with the request
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.free(req)
        self.requests.pop(req.request_id, None)
        self._finished_ids.add(req.request_id)
        self._newly_finished.append(req)

    def take_newly_finished(self) -> list[Request]:
        """The requests finished since the last call, each once (their verdict is final by
        the time the step that finished them returns)."""
        done, self._newly_finished = self._newly_finished, []
        return done

    def fail_step(self, out: SchedulerOutput, error: str) -> list[Request]:
        """A step's model run failed: its unfinished requests finish with the error, and the
        blocks the step was to fill lose their hashes (their KV is not trustworthy)."""
        reqs = [req for req, _ in out.scheduled if not req.is_finished]
        for req in reqs:
            self.kv.drop_uncomputed(req)
            self.finish(req, RequestStatus.FINISHED_ERROR, error=error)
        return reqs

    def uncount(self, out: SchedulerOutput, later: SchedulerOutput | None = None) -> None:
        """A launched step failed to land (async scheduling): its tokens no longer count as
        computed, nor those of `later` (launched after it) for the same requests, so that
        fail_step drops the hashes of every block the failed step was to fill."""
        failed = {id(req) for req, _ in out.scheduled}
        for req, num_new in [*out.scheduled, *(later.scheduled if later else ())]:
            if id(req) in failed and not req.is_finished:  # (preempted since: 0 already)
                req.num_computed_tokens = max(0, req.num_computed_tokens - num_new)

    def abort(self, request_id: str) -> Request | None:
        """Finish the request as aborted; returns it, or None if it is not live."""
        req = self.requests.get(request_id)
        if req is not None:
            self.finish(req, RequestStatus.FINISHED_ABORTED)
        return req


def _count_prefill(out: SchedulerOutput, num_new: int) -> None:
    out.num_prefill_tokens += num_new
    out.num_prefill_reqs += 1
