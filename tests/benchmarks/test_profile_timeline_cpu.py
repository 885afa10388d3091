"""benchmarks/profile_steps.timeline on hand-made kernel spans: busy and idle time per step, gaps
by size, overlapping kernels counted once, and the kernel pairs around the most idle time."""

from __future__ import annotations

import pytest

from benchmarks.profile_steps import timeline


def test_busy_idle_and_the_worst_pair():
    spans = [(0.0, 2.0, "gemm"), (2.5, 4.0, "norm"), (3.0, 5.0, "overlap"), (30.0, 31.0, "gemm"),
             (31.5, 33.0, "norm")]
    line = timeline(spans, steps=2)
    assert line["span_ms_per_step"] == pytest.approx(33.0 / 2e3)
    assert line["busy_ms_per_step"] == pytest.approx((2 + 2.5 + 1 + 1.5) / 2e3)  # union
    assert line["idle_ms_per_step"] == pytest.approx((0.5 + 25 + 0.5) / 2e3)
    assert line["idle_ms_per_step_by_gap"][">20us"] == pytest.approx(25 / 2e3)
    assert line["idle_ms_per_step_by_gap"]["<1us"] == pytest.approx(1 / 2e3)
    worst = line["idle_pairs"][0]
    assert (worst["before"], worst["after"], worst["count"]) == ("overlap", "gemm", 1)
    assert worst["us_per_step"] == pytest.approx(12.5)


def test_no_spans():
    assert timeline([], steps=3) == {}
