"""Opt-in log of slow engine steps ($COMPILED_LLM_STEP_DEBUG=MS): each EngineCore.step() call
that took, with the time since the previous one ended (the core loop's own work: admitting
requests, sending outputs), MS milliseconds or more; with what the step landed held and its
device time, stamped on the monotonic clock that `bench serve`'s send times share."""

from __future__ import annotations

import logging
import os
import time

from compiled_llm.core.scheduler import SchedulerOutput

ENV_STEP_DEBUG = "COMPILED_LLM_STEP_DEBUG"
logger = logging.getLogger(__name__)


class StepLog:
    """Times step() calls; logs at WARNING those over the threshold (off when unset or 0)."""

    def __init__(self) -> None:
        value = os.environ.get(ENV_STEP_DEBUG, "0") or "0"
        try:
            self.min_ms = float(value)
        except ValueError:
            raise ValueError(f"${ENV_STEP_DEBUG} must be milliseconds, got {value!r}") from None
        self.landed: SchedulerOutput | None = None  # set by the core as a step's results land
        self._last_end: float | None = None

    @classmethod
    def from_env(cls) -> StepLog | None:
        """A log when $COMPILED_LLM_STEP_DEBUG asks for one, else None (no per-step work)."""
        log = cls()
        return log if log.min_ms else None

    def begin(self) -> float:
        """The step's start (monotonic seconds)."""
        self.landed = None
        return time.monotonic()

    def end(self, began: float, device_ms: list[float] | tuple = ()) -> None:
        """Log the step that began at `began` if it and the time before it since the last
        step's end took min_ms or more; `device_ms`: the device spans (forward and sampling)
        read during it, the landed step's (two when the step after it ended too)."""
        now = time.monotonic()
        millis = (now - began) * 1e3
        before = 0.0 if self._last_end is None else max(0.0, began - self._last_end) * 1e3
        self._last_end = now
        if not self.min_ms or millis + before < self.min_ms:
            return
        scheduled = self.landed.scheduled if self.landed is not None else []
        prefill = self.landed.num_prefill_tokens if self.landed is not None else 0
        device = "/".join(f"{value:.1f}" for value in device_ms) or "-"
        logger.warning("step: %.1f ms at monotonic %.3f; landed %d requests, %d tokens, "
                       "%d of them prefill; %.1f ms outside steps before it; device %s ms",
                       millis, began, len(scheduled), sum(num_new for _, num_new in scheduled),
                       prefill, before, device)
