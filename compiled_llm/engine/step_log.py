"""Opt-in log of slow engine steps ($COMPILED_LLM_STEP_DEBUG=MS): each EngineCore.step() call of
MS milliseconds or more, with what the step it landed held (tokens, requests, prefill tokens),
stamped on the monotonic clock that `bench serve`'s send times and the collector log share."""

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
        self.min_ms = float(os.environ.get(ENV_STEP_DEBUG, "0") or 0)
        self.landed: SchedulerOutput | None = None  # set by the core as a step's results land

    def begin(self) -> float:
        """The step's start (monotonic seconds)."""
        self.landed = None
        return time.monotonic()

    def end(self, began: float) -> None:
        """Log the step that began at `began` if it took min_ms or more."""
        millis = (time.monotonic() - began) * 1e3
        if not self.min_ms or millis < self.min_ms:
            return
        scheduled = self.landed.scheduled if self.landed is not None else []
        prefill = sum(num_new for _, num_new in scheduled if num_new > 1)
        logger.warning("step: %.1f ms at monotonic %.3f; landed %d requests, %d tokens, "
                       "%d of them prefill", millis, began, len(scheduled),
                       sum(num_new for _, num_new in scheduled), prefill)
