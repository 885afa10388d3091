"""What a step costs, learned from the steps the engine runs: the time of a decode-only step
and the extra time per prefill token on top of it. From them, the most prefill tokens a step
that carries decodes may take so it lasts at most `slowdown` times a decode-only step: the
bound on inter-token latency while prompts arrive (SchedulerConfig.max_decode_slowdown)."""

from __future__ import annotations

SMOOTHING = 0.2  # weight of the newest step in the running averages
# A token's cost is learned from big prefills only: a step with prefill pays a fixed cost too
# (it runs outside the full CUDA graphs), which small prefills would spread over few tokens;
# learned from them, the cap shrank step after step to its floor on the H200 (call 37).
MIN_PREFILL_SAMPLE = 1024
MIN_CAP = 512  # a step with decodes always takes this much prefill: prompts keep moving


class StepCostModel:
    """Running averages of a decode-only step's seconds and a prefill token's extra seconds;
    `prefill_cap()` is None until both are known."""

    def __init__(self, slowdown: float) -> None:
        if not 1 < slowdown < float("inf"):
            raise ValueError(f"max_decode_slowdown must be > 1, got {slowdown}")
        self.slowdown = slowdown
        self.decode_s: float | None = None
        self.token_s: float | None = None

    def observe(self, decodes: int, prefill_tokens: int, seconds: float) -> None:
        """One landed step: its decoding requests, prefill tokens and duration."""
        if decodes and not prefill_tokens:
            self.decode_s = _blend(self.decode_s, seconds)
        elif decodes and self.decode_s is not None and prefill_tokens >= self._min_sample():
            extra = seconds - self.decode_s
            if extra > 0:
                self.token_s = _blend(self.token_s, extra / prefill_tokens)

    def _min_sample(self) -> int:
        """Big enough to say what a token costs, small enough that capped steps still teach
        the model (else a cap under MIN_PREFILL_SAMPLE would never move again)."""
        cap = self.prefill_cap()
        return MIN_PREFILL_SAMPLE if cap is None else min(MIN_PREFILL_SAMPLE, cap // 2)

    def prefill_cap(self) -> int | None:
        """Most prefill tokens for a step with decodes (None: no estimate yet, no cap)."""
        if self.decode_s is None or self.token_s is None:
            return None
        room = (self.slowdown - 1) * self.decode_s / self.token_s
        return max(MIN_CAP, int(room))


def _blend(average: float | None, sample: float) -> float:
    return sample if average is None else average + SMOOTHING * (sample - average)
