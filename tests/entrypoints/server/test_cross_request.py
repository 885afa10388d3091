"""One hostile request of each row of issue 12's table among healthy streams, on the test
model: every hostile one gets a 4xx, never a 5xx; the healthy ones all finish and never stall
(for minutes: the measured figure, on the demo model, is in docs/hardening.md)."""

from __future__ import annotations

from tests.entrypoints.server.hostile import run
from tests.entrypoints.server.inprocess import engine_args, serving


def test_item6_a_hostile_request_among_healthy_streams_hurts_none():
    # 2,200 properties: just under the 64 KB spec limit, about 0.5 s to compile with
    # xgrammar 0.2.9 on the CI machine (1,200 took 1 s with an older one): past 0.2 s
    args = engine_args(structured_outputs_timeout_s=0.2)
    with serving(args, api_key="sk-cross") as srv:
        report = run(srv, slow_properties=2200)
        assert srv.idle(timeout=60)
    statuses = {name: status for name, status, _ in report.hostile}
    assert all(400 <= status < 500 for status in statuses.values()), statuses
    assert statuses["row4 /v1/completions 10 MB without the key"] == 401
    assert not report.healthy_failed and report.healthy_done >= 4
    assert report.longest_wait_s < 15.0, report  # generous: the goal (< 1 s) is measured apart
