"""The order of a step's running requests: decodes first, then prefill chunks, each group in
running order (a long prompt never stalls token streams)."""

from __future__ import annotations

from compiled_llm.core.request import RequestStatus
from tests.core.test_scheduler import make_req, make_sched


def test_decodes_come_before_prefill_chunks_in_running_order():
    sched, _ = make_sched(max_num_batched_tokens=64)
    computed = {"p1": (40, 8), "d1": (5, 4), "p2": (12, 0), "d2": (7, 6)}  # (prompt, done)
    for i, (rid, (num_prompt, done)) in enumerate(computed.items()):
        req = make_req(rid, num_prompt, float(i))
        req.num_computed_tokens, req.status = done, RequestStatus.RUNNING
        sched.running.append(req)
    out = sched.schedule()
    assert [(r.request_id, n) for r, n in out.scheduled] == [
        ("d1", 1), ("d2", 1), ("p1", 32), ("p2", 12)]
    assert [r.request_id for r in sched.running] == ["p1", "d1", "p2", "d2"]  # unchanged
