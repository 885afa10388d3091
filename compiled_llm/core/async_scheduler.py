"""The async scheduler: scheduling when step N+1 is launched before step N's tokens are read.
A launched step's sampled token is *pending* on its request (in num_tokens, not all_token_ids)
until the host reads it; the input batch writes it as ~row of the launched step's sampled
tensor, filled in on the device. A step whose sampling needs a pending token on the host has
the step in flight land between its forward and its sampling (must_land_first)."""

from __future__ import annotations

from compiled_llm.core.request import Request
from compiled_llm.core.scheduler import Scheduler, SchedulerOutput


class AsyncScheduler(Scheduler):
    """Scheduler whose steps are launched before the previous step's tokens land."""

    def advance(self, out: SchedulerOutput, sample_reqs: list[Request] = ()) -> None:
        """The step is launched: its tokens count as computed, and each of sample_reqs (in
        sampled-tensor order) has one more pending token."""
        super().advance(out)
        for row, req in enumerate(sample_reqs):
            req.num_pending += 1
            req.pending_src = row

    def _token_landed(self, req: Request) -> None:
        if req.num_pending:
            req.num_pending -= 1

    def _nothing_to_compute(self, req: Request) -> bool:
        """A launched step samples req's last token (a length limit): schedule no more."""
        if not req.num_pending:
            return False
        max_tokens = req.sampling_params.max_tokens
        return req.num_tokens >= self.cfg.max_model_len or (
            max_tokens is not None and req.num_output_tokens + req.num_pending >= max_tokens)

    def must_land_first(self, sample_reqs: list[Request]) -> bool:
        """Whether a sampling row of the step being launched reads its pending token on the
        host (a grammar's bitmask, a logits processor's output ids): then the step in flight
        lands before this step's sampling is built (its forward already runs)."""
        return any(req.num_pending and req.needs_feedback for req in sample_reqs)
