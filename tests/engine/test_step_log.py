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


def test_names_the_landed_steps_device_time(monkeypatch, caplog, tmp_path):
    """The device span read during the step is on its line, and benchmarks.itl_gaps reads it
    back (a slow served step is the device's or the host's)."""
    from benchmarks import itl_gaps

    monkeypatch.setenv(step_log.ENV_STEP_DEBUG, "0.0001")
    log = step_log.StepLog()
    began = log.begin()
    log.landed = SchedulerOutput([(_Req(), 1), (_Req(), 500)], num_prefill_tokens=500,
                                 num_prefill_reqs=1)
    with caplog.at_level(logging.WARNING, logger=step_log.__name__):
        log.end(began - 0.02, [8.25])
    [record] = caplog.records
    assert record.getMessage().endswith("; device 8.2 ms")
    path = tmp_path / "serve.log"
    path.write_text(record.getMessage() + "\n")
    [step] = itl_gaps.steps(path)
    assert step[3] == 500 and abs(step[5] - 0.0082) < 1e-9
    assert itl_gaps.step_makeup([step])["median_device_ms"] == 8.2


def test_timer_reports_the_spans_it_read():
    """On the CPU a step's device span is its host span from forward to gpu_done."""
    import torch

    from compiled_llm.worker.step_timer import StepTimer

    timer = StepTimer(torch.device("cpu"))
    timer.begin()
    timer.scheduled()
    timer.forward_start()
    timer.gpu_done()
    timer.executed()
    timer.end()
    [millis] = timer.collected_ms
    assert 0 <= millis < 1e3
    timer.begin()
    assert timer.collected_ms == []
