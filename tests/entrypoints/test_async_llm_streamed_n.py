"""AsyncLLM with n > 1 streamed: a step's per-child outputs reach the consumer as one (vLLM's
collector merges what its consumer has not read), DELTA pieces join to the FINAL_ONLY
sequences, and a CUMULATIVE output carries whole only the sequences that moved (vLLM's)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from compiled_llm import SamplingParams
from compiled_llm.entrypoints.async_llm import AsyncLLM
from compiled_llm.entrypoints.request_stream import put_all
from compiled_llm.output.outputs import CompletionOutput, RequestOutput
from compiled_llm.sampling_params import RequestOutputKind as Kind
from tests.entrypoints.server.inprocess import engine_args

PROMPT = "The quick brown"


@pytest.fixture(scope="module")
def engine():
    eng = AsyncLLM(engine_args())
    yield eng
    eng.shutdown()


def _out(index: int, text: str, finished: bool = False) -> RequestOutput:
    return RequestOutput("r", None, [1], None, [CompletionOutput(index, text, [len(text)])],
                         finished)


def test_put_all_merges_one_steps_child_outputs_per_stream():
    async def main():
        a, b = (SimpleNamespace(queue=asyncio.Queue()) for _ in range(2))
        error = RuntimeError("dead")
        put_all([(a, (1.0, _out(0, "x"))), (a, (1.0, _out(2, "y", True))),
                 (b, (1.0, _out(1, "z"))), (b, (1.0, error))])
        return [[q.get_nowait() for _ in range(q.qsize())] for q in (a.queue, b.queue)]

    got_a, got_b = asyncio.run(main())
    ((_, merged),) = got_a
    assert merged.finished and [(o.index, o.text) for o in merged.outputs] == [(0, "x"),
                                                                              (2, "y")]
    assert [type(item[1]) for item in got_b] == [RequestOutput, RuntimeError]


def _gen(engine, rid: str, kind: Kind, **kw) -> list[RequestOutput]:
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=10, ignore_eos=True,
                            output_kind=kind, **kw)

    async def main():
        return [out async for out in engine.generate(PROMPT, params, rid)]

    return asyncio.run(main())


def test_streamed_children_agree_with_final_only(engine):
    probe = _gen(engine, "probe", Kind.FINAL_ONLY)[-1].outputs[0].text
    stop = [probe.strip()[1] if len(probe.strip()) > 1 else probe[0]]  # ends child 0 early
    (final,) = _gen(engine, "final", Kind.FINAL_ONLY, stop=stop)
    want = {o.index: (o.text, o.token_ids, o.finish_reason) for o in final.outputs}
    deltas = _gen(engine, "delta", Kind.DELTA, stop=stop)
    assert [out.finished for out in deltas] == [False] * (len(deltas) - 1) + [True]
    joined: dict[int, tuple] = {}
    for out in deltas:
        for o in out.outputs:
            text, ids, _ = joined.get(o.index, ("", [], None))
            joined[o.index] = (text + o.text, ids + o.token_ids, o.finish_reason)
    assert joined == want
    cumulative = _gen(engine, "cumulative", Kind.CUMULATIVE, stop=stop)
    ended: set[int] = set()
    for out in cumulative:
        for o in out.outputs:
            assert o.index not in ended  # a finished sequence is not shown again
            assert want[o.index][1][: len(o.token_ids)] == o.token_ids  # whole so far
            if o.finish_reason:
                ended.add(o.index)
                assert (o.text, o.token_ids, o.finish_reason) == want[o.index]
    # (a consumer some steps behind gets the last steps merged: every sequence may end in it)
    assert ended == {0, 1, 2} and cumulative[-1].finished
