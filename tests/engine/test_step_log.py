"""The opt-in slow-step log: off by default; with a threshold, one line per step over it,
naming what the landed step held."""

from __future__ import annotations

import logging

from compiled_llm.core.scheduler import SchedulerOutput
from compiled_llm.engine import step_log


class _Req:
    pass


def test_logs_steps_over_the_threshold(monkeypatch, caplog):
    monkeypatch.setenv(step_log.ENV_STEP_DEBUG, "0.0001")
    log = step_log.StepLog()
    began = log.begin()
    log.landed = SchedulerOutput([(_Req(), 1), (_Req(), 1), (_Req(), 300)],
                                 num_prefill_tokens=300, num_prefill_reqs=1)
    with caplog.at_level(logging.WARNING, logger=step_log.__name__):
        log.end(began - 1.0)  # a step of a second
    [record] = caplog.records
    assert "landed 3 requests, 302 tokens, 300 of them prefill" in record.getMessage()
    assert "0.0 ms outside steps before it" in record.getMessage()  # the first step


def test_off_by_default(monkeypatch, caplog):
    monkeypatch.delenv(step_log.ENV_STEP_DEBUG, raising=False)
    log = step_log.StepLog()
    with caplog.at_level(logging.WARNING, logger=step_log.__name__):
        log.end(log.begin() - 1.0)
    assert caplog.records == []
