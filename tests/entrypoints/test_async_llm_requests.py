"""AsyncLLM's request timings and vLLM's add_request arguments: a FINAL_ONLY request is timed
by the steps that made its tokens (not by its one output), n > 1 children count as finished
requests apiece, and priority, tokenization_kwargs, prompt_text and arrival_time work while
trace_headers and another data-parallel rank are refused by name."""

from __future__ import annotations

import asyncio
import time

import pytest

from compiled_llm import SamplingParams
from compiled_llm.config import EngineArgs
from compiled_llm.entrypoints.async_llm import AsyncLLM
from compiled_llm.entrypoints.request_stream import RequestObserver, RequestSummary
from compiled_llm.sampling_params import RequestOutputKind as Kind
from tests.utils import make_checkpoint


class Recorder(RequestObserver):
    """Keeps every hook call."""

    def __init__(self) -> None:
        self.outputs: list[tuple[str, int, bool, float]] = []
        self.finishes: list[tuple[str, int, int, float]] = []
        self.prompts: list[int] = []
        self.summaries: list[RequestSummary] = []

    def on_output(self, rid: str, new_tokens: int, first: bool, gap_s: float,
                  prompt_tokens: int = 0) -> None:
        self.outputs.append((rid, new_tokens, first, gap_s))
        self.prompts.append(prompt_tokens)

    def on_request_end(self, summary: RequestSummary) -> None:
        self.summaries.append(summary)

    def on_finish(self, outcome: str, prompt_tokens: int, gen_tokens: int,
                  e2e_s: float) -> None:
        self.finishes.append((outcome, prompt_tokens, gen_tokens, e2e_s))


@pytest.fixture(scope="module")
def ckpt() -> str:
    return str(make_checkpoint("llama"))


@pytest.fixture(scope="module")
def engine(ckpt):
    eng = AsyncLLM(EngineArgs(model=ckpt, enforce_eager=True, dtype="float32"),
                   observer=Recorder())
    yield eng
    eng.shutdown()


def _final(max_tokens: int = 12, **kw) -> SamplingParams:
    kw = {"temperature": 0.0, "ignore_eos": True, **kw}
    return SamplingParams(max_tokens=max_tokens, output_kind=Kind.FINAL_ONLY, **kw)


async def _run(engine: AsyncLLM, rid: str, prompt, params: SamplingParams, **kw):
    return [out async for out in engine.generate(prompt, params, rid, **kw)]


def test_final_only_timed_by_its_steps(engine):
    engine.observer.__init__()
    outs = asyncio.run(_run(engine, "t0", "The quick brown", _final()))
    (out,) = outs
    stats = out.metrics
    assert stats.num_generation_tokens == 12 == len(out.outputs[0].token_ids)
    assert stats.first_token_ts < stats.last_token_ts
    calls = [c for c in engine.observer.outputs if c[0] == "t0"]
    (outcome, _, gen_tokens, e2e), = engine.observer.finishes
    assert (outcome, gen_tokens) == ("length", 12)
    # one first-token observation of the first step's token, then the rest as gaps
    assert calls[0][1:3] == (1, True) and not any(first for _, _, first, _ in calls[1:])
    assert sum(tokens for _, tokens, _, _ in calls) == 12 and len(calls) > 2
    ttft = calls[0][3]
    assert 0 < ttft < e2e and sum(gap for *_, gap in calls) <= e2e
    prompt_tokens = len(out.prompt_token_ids)
    assert engine.observer.prompts == [prompt_tokens] + [0] * (len(calls) - 1)
    (summary,) = engine.observer.summaries
    assert (summary.n, summary.max_tokens, summary.max_gen_tokens) == (1, 12, 12)
    assert 0 < summary.decode_s == pytest.approx(sum(gap for *_, gap in calls[1:]))
    assert stats.scheduled_ts is not None and summary.queue_s >= 0
    assert summary.prefill_s + summary.decode_s == pytest.approx(summary.inference_s)
    assert summary.queue_s + summary.prefill_s == pytest.approx(ttft)


def test_streamed_outputs_keep_delivery_timing(engine):
    engine.observer.__init__()
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True,
                            output_kind=Kind.DELTA)
    outs = asyncio.run(_run(engine, "d0", "The quick brown", params))
    assert all(out.metrics is None for out in outs[:-1])
    assert outs[-1].metrics.token_steps is None and outs[-1].metrics.scheduled_ts is not None
    (summary,) = engine.observer.summaries
    # timed by delivery: on a loaded host every token may reach the stream in one output
    assert summary.queue_s >= 0 and summary.inference_s >= summary.prefill_s > 0
    assert summary.decode_s == pytest.approx(summary.inference_s - summary.prefill_s)
    calls = engine.observer.outputs
    assert calls[0][2] and sum(tokens for _, tokens, _, _ in calls) == 6
    assert [(outcome, gen) for outcome, _, gen, _ in engine.observer.finishes] == [("length", 6)]


def test_n_children_count_apiece(engine):
    engine.observer.__init__()
    params = _final(max_tokens=5, n=2, temperature=1.0, seed=3)
    (out,) = asyncio.run(_run(engine, "n0", "The quick brown", params))
    assert len(out.outputs) == 2 and out.metrics.num_generation_tokens == 10
    finishes = engine.observer.finishes
    assert [(outcome, gen) for outcome, _, gen, _ in finishes] == [("length", 5)] * 2
    assert engine.observer.prompts[0] == 2 * len(out.prompt_token_ids)  # once per sequence
    assert [(s.n, s.max_gen_tokens) for s in engine.observer.summaries] == [(2, 5)]
    assert engine.engine.num_used_blocks == 0


def test_tokenization_kwargs_and_prompt_text(engine):
    whole = asyncio.run(_run(engine, "k0", "The quick brown", _final(2)))[0]
    cut = asyncio.run(_run(engine, "k1", "The quick brown", _final(2),
                           tokenization_kwargs={"truncation": True, "max_length": 2}))[0]
    assert len(whole.prompt_token_ids) > 2 and cut.prompt_token_ids == whole.prompt_token_ids[:2]
    named = asyncio.run(_run(engine, "k2", whole.prompt_token_ids, _final(2),
                             prompt_text="The quick brown"))[0]
    assert named.prompt == "The quick brown"
    assert named.outputs[0].token_ids == whole.outputs[0].token_ids


def test_arrival_time_starts_the_clock(engine):
    engine.observer.__init__()
    asyncio.run(_run_added(engine, "a0", arrival_time=time.time() - 5.0))
    (_, _, _, e2e), = engine.observer.finishes
    assert 5.0 <= e2e < 60.0


async def _run_added(engine: AsyncLLM, rid: str, **kw) -> None:
    stream = await engine.add_request(rid, "The quick", _final(2), **kw)
    async for _ in stream:
        pass


@pytest.mark.parametrize("kw, field", [({"priority": 1}, "priority"),
                                       ({"trace_headers": {"traceparent": "x"}}, "trace_headers"),
                                       ({"data_parallel_rank": 1}, "data_parallel_rank"),
                                       ({"tokenization_kwargs": ["x"]}, "tokenization_kwargs"),
                                       ({"prompt_text": "t"}, "prompt_text")])
def test_refused_arguments_name_their_field(engine, kw, field):
    with pytest.raises(ValueError, match=field):
        asyncio.run(_run(engine, f"r-{field}", "The quick", _final(2), **kw))
    assert engine.engine.num_used_blocks == 0 and not engine._streams


def test_priority_with_priority_policy(ckpt):
    eng = AsyncLLM(EngineArgs(model=ckpt, enforce_eager=True, dtype="float32",
                              scheduling_policy="priority"))
    try:
        async def main():
            return await asyncio.gather(
                _run(eng, "p0", "The quick", _final(3), priority=5),
                _run(eng, "p1", "The quick", _final(3), priority=-1))
        low, high = asyncio.run(main())
        assert low[0].outputs[0].token_ids == high[0].outputs[0].token_ids
    finally:
        eng.shutdown()
