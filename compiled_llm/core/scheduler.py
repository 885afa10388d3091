"""Scheduler: decides each step which requests run and how many tokens each.

Continuous batching under a token budget and a sequence cap, chunked prefill (running requests
first, decodes before prefill chunks), prefix-cache hits on admission, a waiting order set by
the policy (fcfs or priority), and preemption by recompute when KV blocks run out (the newest,
or under priority the least urgent, running request). Pure Python: its output is a plain
description of the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from compiled_llm.config import SchedulerConfig
from compiled_llm.core.kv_cache_manager import KVCacheManager
from compiled_llm.core.request import Request, RequestStatus
from compiled_llm.core.request_queue import make_queue, victim_key


@dataclass
class SchedulerOutput:
    """One step: requests with their new-token counts, in batch order."""

    scheduled: list[tuple[Request, int]] = field(default_factory=list)
    finished_req_ids: set[str] = field(default_factory=set)  # since the previous step
    preempted_req_ids: set[str] = field(default_factory=set)  # in this step's scheduling
    num_preempted: int = 0

    @property
    def total_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, kv: KVCacheManager) -> None:
        self.cfg = cfg
        self.kv = kv
        self.waiting = make_queue(cfg.scheduling_policy)
        self._victim_key = victim_key(cfg.scheduling_policy)
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self._finished_ids: set[str] = set()
        self.num_preemptions = 0

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
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(finished_req_ids=self._finished_ids)
        self._finished_ids = set()
        budget = self._schedule_running(out, self.cfg.max_num_batched_tokens)
        if not out.num_preempted:
            self._schedule_waiting(out, budget)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        # decodes first, then ongoing prefill chunks: a long prompt never stalls token streams
        order = sorted(self.running, key=lambda r: r.num_tokens - r.num_computed_tokens > 1)
        for req in order:
            if budget <= 0:
                break
            if req.status is not RequestStatus.RUNNING:  # preempted earlier in this loop
                continue
            if req.num_pending and self._last_is_pending(req):
                continue  # its final token is being sampled: nothing left to compute
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if not self._allocate_or_preempt(req, n, out):
                continue
            out.scheduled.append((req, n))
            budget -= n
        return budget

    def _allocate_or_preempt(self, req: Request, n: int, out: SchedulerOutput) -> bool:
        while not self.kv.allocate_slots(req, n):
            scheduled = {id(r) for r, _ in out.scheduled}  # only on the rare failure path
            victims = [r for r in self.running if id(r) not in scheduled]
            if victims == [req] and not self.kv.can_ever_fit(req.num_computed_tokens + n):
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
            n = min(left, budget)
            if not self.cfg.enable_chunked_prefill and n < left:
                break
            if not self.kv.allocate_slots(req, n, hits):
                break
            self.waiting.pop()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.scheduled.append((req, n))
            budget -= n

    def preempt(self, req: Request) -> None:
        """Free req's blocks (cached ones stay reusable) and requeue it, to be recomputed."""
        self.running.remove(req)
        self.kv.free(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        req.status = RequestStatus.PREEMPTED
        self.waiting.requeue(req)

    def _last_is_pending(self, req: Request) -> bool:
        """A launched step samples req's last token (a length limit): schedule no more."""
        max_tokens = req.sampling_params.max_tokens
        return req.num_tokens >= self.cfg.max_model_len or (
            max_tokens is not None and req.num_output_tokens + req.num_pending >= max_tokens)

    def update(self, out: SchedulerOutput, sampled: dict[str, int]) -> list[Request]:
        """A step that ran to the end: advance progress, then take its sampled tokens."""
        self.advance(out)
        return self.resolve(out, sampled)

    def advance(self, out: SchedulerOutput, sample_reqs: list[Request] = ()) -> None:
        """The step is launched: its tokens count as computed, and each of sample_reqs (in
        sampled-tensor order) has one more pending token (async scheduling)."""
        for req, n in out.scheduled:
            if not req.is_finished:  # finished (aborted) while the step ran
                req.num_computed_tokens += n
        for i, req in enumerate(sample_reqs):
            req.num_pending += 1
            req.pending_src = i

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
            if req.num_pending:
                req.num_pending -= 1
            req.append_token(token)
            progressed.append(req)
            status, reason = self._check_stop(req, token)
            if status is not None:
                self.finish(req, status, reason)
        return progressed

    def _check_stop(self, req: Request, token: int) -> tuple[RequestStatus | None, int | None]:
        p = req.sampling_params
        if req.num_output_tokens >= p.min_tokens:
            if not p.ignore_eos and token in req.eos_token_ids:
                return RequestStatus.FINISHED_STOPPED, None
            if token in p.stop_token_ids:
                return RequestStatus.FINISHED_STOPPED, token
        if p.max_tokens is not None and req.num_output_tokens >= p.max_tokens:
            return RequestStatus.FINISHED_LENGTH, None
        if len(req.all_token_ids) >= self.cfg.max_model_len:  # known tokens, not pending
            return RequestStatus.FINISHED_LENGTH, None
        return None, None

    def finish(self, req: Request, status: RequestStatus, reason: int | str | None = None) -> None:
        """End a request now (stop, length, abort, error) and return its blocks at once."""
        if req.is_finished:
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

    def abort(self, request_id: str) -> Request | None:
        req = self.requests.get(request_id)
        if req is not None:
            self.finish(req, RequestStatus.FINISHED_ABORTED)
        return req
