"""The speculative-decoding scheduler: a decoding request with k drafts computes its last token
and the drafts in one step (k+1 query tokens, verified by the worker), slots reserved within
max_model_len, max_tokens and the budget; after the step num_computed_tokens drops to the
accepted length. Drafts never enter all_token_ids (never hashed). Verify steps are synchronous;
a step with `speculating` off (disable_by_batch_size) drops the drafts and may run async."""

from __future__ import annotations

from dataclasses import dataclass, field

from compiled_llm.config import SchedulerConfig
from compiled_llm.core.async_scheduler import AsyncScheduler
from compiled_llm.core.kv_cache_manager import KVCacheManager
from compiled_llm.core.request import Request, RequestStatus
from compiled_llm.core.scheduler import SchedulerOutput
from compiled_llm.sampling_params import SamplingType


@dataclass
class SpecDecodingStats:
    """Cumulative counters, as vLLM's spec_decode metrics: drafts (verify steps of a request),
    draft tokens, accepted tokens, and accepted tokens by draft position."""

    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.accepted_per_pos = [0] * self.num_spec_tokens

    def observe(self, num_draft: int, num_accepted: int) -> None:
        """One request's verify step: num_accepted of its num_draft drafts were accepted."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft
        self.num_accepted_tokens += num_accepted
        for pos in range(num_accepted):
            self.accepted_per_pos[pos] += 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted over proposed draft tokens (0.0 before any)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0


@dataclass
class FruitlessPause:
    """N-gram speculation that auto-disables: after a speculative step that accepted no draft
    or left no request with drafts, the next `length` steps run without speculation (async);
    `length` doubles up to max_pause while that lasts and drops back to 1 after a fruitful
    step. Output is unchanged: only when drafts are looked for and verified."""

    max_pause: int = 16
    pause: int = 0  # steps left to run without speculation
    length: int = 1  # the next pause's length

    def after_step(self, fruitful: bool) -> None:
        """A speculative step landed; fruitful: it accepted drafts or left some to verify."""
        if fruitful:
            self.length = 1
            return
        self.pause, self.length = self.length, min(2 * self.length, self.max_pause)

    def take(self) -> bool:
        """Whether the next step is paused (one paused step is used up)."""
        if not self.pause:
            return False
        self.pause -= 1
        return True


class SpecScheduler(AsyncScheduler):
    """Scheduler that schedules each decoding request's draft tokens with it. resolve() takes,
    per request, one sampled token (an int) or the accepted drafts plus one token (a list),
    and set_drafts() the proposals for the next step. Invariants: a step with drafts is
    scheduled with no step in flight (no pending tokens); after resolving a verify step, an
    unfinished request has num_computed_tokens == len(all_token_ids) - 1."""

    def __init__(self, cfg: SchedulerConfig, kv: KVCacheManager, num_spec_tokens: int,
                 lookahead: int = 0, disable_by_batch_size: int | None = None,
                 pause_when_fruitless: bool = False) -> None:
        super().__init__(cfg, kv)
        self.num_spec_tokens = num_spec_tokens
        self.lookahead = lookahead  # slots past the drafts a draft model writes while proposing
        self.disable_by_batch_size = disable_by_batch_size
        self.pause = FruitlessPause() if pause_when_fruitless else None
        self.speculating = True  # whether the next step may verify drafts (the core sets it)
        self.spec_stats = SpecDecodingStats(num_spec_tokens)
        self._step_verify = (0, 0)  # the last resolved step's (verify requests, accepted)
        # live requests that sample from their own seed: while any is, n-gram speculation
        # does not pause, since whether a step verifies a request's drafts must not depend on
        # the other requests, or its seed would draw another sequence in another batch (vLLM's
        # seeded outputs do not depend on the batch)
        self._seeded: set[str] = set()

    def add_request(self, req: Request) -> None:
        """Queue a request (noting a seeded sampling one: it holds fruitless pauses off); one
        arriving at an idle scheduler starts speculation afresh."""
        idle = not self.has_unfinished()
        super().add_request(req)
        if idle and self.pause is not None:
            # the pause judged the lookups of requests now gone: a new batch's prompts may copy
            # well, and an old pause (up to max_pause steps) would hide all of a short reply
            self.pause = FruitlessPause(self.pause.max_pause)
        if req.sampling_params.sampling_type is SamplingType.RANDOM_SEED:
            self._seeded.add(req.request_id)

    def finish(self, req: Request, status: RequestStatus, reason: int | str | None = None,
               error: str | None = None) -> None:
        """Finish as usual, forgetting the request's seed."""
        super().finish(req, status, reason, error)
        self._seeded.discard(req.request_id)

    def plan_speculation(self) -> bool:
        """Whether the next step speculates: not in a fruitless pause (which this call counts
        down; none while a seeded sampling request is live, as its drafts must not depend on
        the batch), and its batch (running requests plus the waiting ones that could join, up
        to max_num_seqs) below disable_by_batch_size."""
        if self.pause is not None and not self._seeded and self.pause.take():
            return False
        limit = self.disable_by_batch_size
        if limit is None:
            return True
        return min(len(self.running) + len(self.waiting), self.cfg.max_num_seqs) < limit

    def _num_new_tokens(self, req: Request, budget: int) -> int:
        num_new = super()._num_new_tokens(req, budget)
        if not req.spec_token_ids:
            return num_new
        if not self.speculating:
            req.spec_token_ids = []  # a step without speculation: the drafts go unverified
            return num_new
        if num_new != 1 or req.num_tokens - req.num_computed_tokens != 1:
            req.spec_token_ids = []  # not a plain decode (recomputing): the drafts are stale
            return num_new
        params = req.sampling_params
        room = min(budget - 1, self.cfg.max_model_len - req.num_tokens - 1)
        if params.max_tokens is not None:
            room = min(room, params.max_tokens - req.num_output_tokens - 1)
        req.spec_token_ids = req.spec_token_ids[:max(room, 0)]
        return 1 + len(req.spec_token_ids)

    def _lookahead(self, req: Request, num_new: int) -> int:
        # within max_model_len: an admitted request's prefix-cache hits are not counted in yet
        room = self.cfg.max_model_len - max(req.num_computed_tokens + num_new, req.num_tokens)
        return max(0, min(self.lookahead, room))

    def _allocate_or_preempt(self, req: Request, num_new: int, out: SchedulerOutput) -> bool:
        return super()._allocate_or_preempt(req, num_new + self._lookahead(req, num_new), out)

    def preempt(self, req: Request) -> None:
        """Preempt as usual; the drafts go (the request recomputes from its known tokens)."""
        req.spec_token_ids = []
        super().preempt(req)

    def resolve(self, out: SchedulerOutput, sampled: dict[str, int | list[int]]) -> list[Request]:
        """Append each request's tokens up to its first stop (never past it), count the
        verification, and roll the computed length back to the accepted tokens."""
        progressed, verified, accepted = [], 0, 0
        for req, _ in out.scheduled:
            tokens = sampled.get(req.request_id)
            if req.is_finished or tokens is None:
                continue
            drafts, req.spec_token_ids = req.spec_token_ids, []
            first_block = (len(req.all_token_ids) - 1) // self.kv.block_size
            if isinstance(tokens, int):
                tokens, first_block = [tokens], -1
                if req.num_pending:  # an async step's token (hot: test the field first)
                    self._token_landed(req)
            else:
                self.spec_stats.observe(len(drafts), len(tokens) - 1)
                verified, accepted = verified + 1, accepted + len(tokens) - 1
            for token in tokens:
                req.append_token(token)
                if self._stop_after(req, token):
                    break
            progressed.append(req)
            if not req.is_finished and first_block >= 0:  # a verify step: roll back, publish
                req.num_computed_tokens = len(req.all_token_ids) - 1
                self.kv.cache_computed_blocks(req, first_block)
        self._step_verify = (verified, accepted)
        return progressed

    def _stop_after(self, req: Request, token: int) -> bool:
        """Apply the stop checks to one appended token; whether the request finished."""
        status, reason = self._check_stop(req, token)
        if status is None and req.grammar is not None:
            status, reason = self._check_grammar(req, token)
        if status is not None:
            self.finish(req, status, reason)
        return status is not None

    def set_drafts(self, drafts: dict[str, list[int]]) -> None:
        """Store the proposals for the next step on the requests still running (after a
        speculative step's resolve: its verification and these drafts decide a pause)."""
        stored = 0
        for request_id, tokens in drafts.items():
            req = self.requests.get(request_id)
            if req is not None and not req.is_finished and tokens:
                req.spec_token_ids = list(tokens[:self.num_spec_tokens])
                stored += 1
        if self.pause is not None:
            verified, accepted = self._step_verify
            self.pause.after_step(stored > 0 and (accepted > 0 or not verified))
