"""LLMEngine.step with n > 1 and a streamed output kind, the core in process and in its own:
vLLM's shape (one output per child that moved, one CompletionOutput each, finished only on the
last), the same sequences as FINAL_ONLY, stop strings per sequence, an abort's last output."""

from __future__ import annotations

import pytest

from compiled_llm import LLM, SamplingParams
from compiled_llm.sampling_params import RequestOutputKind as Kind
from tests.entrypoints.server.inprocess import engine_args

PROMPT = "The quick brown"
N = 3


@pytest.fixture(scope="module", params=[False, True], ids=["in-process", "core-process"])
def engine(request):
    llm = LLM(**{**vars(engine_args()), "engine_core_process": request.param})
    yield llm.llm_engine
    llm.shutdown()


def _run(engine, rid: str, kind: Kind, **kw) -> list:
    params = SamplingParams(n=N, temperature=1.0, seed=7, max_tokens=8, ignore_eos=True,
                            output_kind=kind, **kw)
    engine.add_request(rid, PROMPT, params)
    outs = []
    while engine.has_unfinished_requests():
        outs.extend(out for out in engine.step() if out.request_id == rid)
    return outs


def _check_shape(outs: list) -> None:
    assert all(len(out.outputs) == 1 for out in outs)
    assert [out.finished for out in outs] == [False] * (len(outs) - 1) + [True]
    ends = [out.outputs[0].index for out in outs if out.outputs[0].finish_reason]
    assert sorted(ends) == list(range(N))  # each sequence ends once
    for index in range(N):  # nothing of a sequence after its end
        mine = [out.outputs[0] for out in outs if out.outputs[0].index == index]
        assert [o.finish_reason is not None for o in mine][-1]
        assert not any(o.finish_reason for o in mine[:-1])


@pytest.mark.parametrize("stop", [False, True], ids=["plain", "stop-string"])
def test_streamed_children_match_final_only(engine, stop):
    kw = {}
    if stop:  # a character child 0 shows early: some sequences stop on it, maybe not all
        first = _run(engine, "probe", Kind.FINAL_ONLY)[-1].outputs[0].text
        kw = {"stop": [first.strip()[1] if len(first.strip()) > 1 else first[0]]}
    final = _run(engine, "final", Kind.FINAL_ONLY, **kw)
    assert len(final) == 1 and [o.index for o in final[0].outputs] == list(range(N))
    want = {o.index: o for o in final[0].outputs}
    assert not stop or "stop" in {o.finish_reason for o in want.values()}
    deltas = _run(engine, "delta", Kind.DELTA, **kw)
    _check_shape(deltas)
    # per child and per step, not per step alone; one output of the process core's front end
    # may carry every step (merged) on a loaded host, one in-process step is one core step
    assert len(deltas) >= N and (len(deltas) > N or stop or engine._core_process)
    for index, o in want.items():
        mine = [out.outputs[0] for out in deltas if out.outputs[0].index == index]
        assert "".join(m.text for m in mine) == o.text
        assert sum((m.token_ids for m in mine), []) == o.token_ids
        assert mine[-1].finish_reason == o.finish_reason
        assert mine[-1].stop_reason == o.stop_reason
    cumulative = _run(engine, "cumulative", Kind.CUMULATIVE, **kw)
    _check_shape(cumulative)
    last = {out.outputs[0].index: out.outputs[0] for out in cumulative}
    assert {i: (c.text, c.token_ids) for i, c in last.items()} == {
        i: (o.text, o.token_ids) for i, o in want.items()}
    assert engine.num_used_blocks == 0


def test_an_abort_gives_every_unfinished_child_in_one_last_output(engine):
    params = SamplingParams(n=N, temperature=1.0, seed=7, max_tokens=400, ignore_eos=True,
                            output_kind=Kind.DELTA)
    engine.add_request("abort", PROMPT, params)
    outs = []
    while len({out.outputs[0].index for out in outs}) < N:
        outs.extend(engine.step())
    assert not any(out.finished for out in outs)
    last = engine.abort_request("abort")
    assert last.finished and [o.index for o in last.outputs] == list(range(N))
    assert all(o.finish_reason == "abort" for o in last.outputs)
    while engine.has_unfinished_requests():  # a launched step may still be read
        assert engine.step() == []  # nothing more of the aborted request
    assert engine.num_used_blocks == 0
