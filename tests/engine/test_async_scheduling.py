"""Async scheduling: step N+1 is scheduled and launched before step N's tokens are read. It must
give the same tokens as step-by-step execution, through chunked prefill, preemption, prefix
caching, stops and aborts, and leave no KV block held."""

from __future__ import annotations

import pytest

from compiled_llm import LLM, SamplingParams
from tests.utils import make_checkpoint, random_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


def _llm(ckpt, **kw) -> LLM:
    kw.setdefault("async_scheduling", False)  # the baselines run step by step
    return LLM(str(ckpt), enforce_eager=True, dtype="float32", **kw)


@pytest.fixture(scope="module")
def ckpt():
    return make_checkpoint("llama")


@pytest.fixture(scope="module")
def prompts():
    return [{"prompt_token_ids": p} for p in random_prompts(8, 300, lo=5, hi=120)]


@pytest.fixture(scope="module")
def baseline(ckpt, prompts):
    return _tokens(_llm(ckpt).generate(prompts, GREEDY, use_tqdm=False))


@pytest.fixture(scope="module")
def llm(ckpt):
    return _llm(ckpt, async_scheduling=True)


def test_same_tokens_as_sync(llm, prompts, baseline):
    assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == baseline
    assert llm.engine.num_used_blocks == 0
    assert not llm.engine.has_unfinished_requests()


def test_steps_overlap_one_step_behind(llm, prompts):
    """A step returns the outputs of the step launched before it: the first call only
    launches, and a decode request runs with its input token still pending."""
    e = llm.engine
    e.add_request("a", prompts[0], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    assert e.step() == []  # prefill launched, nothing landed yet
    assert e.step()[0].outputs[0].token_ids.__len__() == 1  # decode launched, prefill landed
    req = e.scheduler.requests["a"]
    assert req.num_pending == 1 and len(req.output_token_ids) == 1
    while e.has_unfinished_requests():
        e.step()
    assert len(req.output_token_ids) == 4 and e.num_used_blocks == 0


def test_chunked_prefill_and_preemption(ckpt, prompts, baseline):
    small = _llm(ckpt, async_scheduling=True, max_num_batched_tokens=16)
    assert _tokens(small.generate(prompts, GREEDY, use_tqdm=False)) == baseline
    assert small.engine.num_used_blocks == 0
    tight = _llm(ckpt, async_scheduling=True, num_gpu_blocks_override=14)
    assert _tokens(tight.generate(prompts, GREEDY, use_tqdm=False)) == baseline
    assert tight.engine.scheduler.num_preemptions > 0
    assert tight.engine.num_used_blocks == 0


def test_stop_token_drops_the_extra_step(llm, prompts, baseline):
    """The step after a stop token is already launched when the stop is read: its token is
    dropped, so the output ends exactly at the stop."""
    stop_tok = baseline[2][5]
    first = baseline[2].index(stop_tok)
    p = SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=[stop_tok], ignore_eos=True)
    out = llm.generate(prompts[2], p, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == baseline[2][: first + 1]
    assert out.finish_reason == "stop" and llm.engine.num_used_blocks == 0


def test_prefix_cache_holds_decoded_blocks(ckpt, prompts, baseline):
    """Blocks filled while their last token was pending are still published: a second request
    whose prompt is the first one's prompt plus its output hits them."""
    llm = _llm(ckpt, async_scheduling=True, block_size=4)
    ids = prompts[3]["prompt_token_ids"]
    first = llm.generate(prompts[3], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    assert first == baseline[3]
    before = llm.engine.prefix_cache_stats.hit_tokens
    follow = {"prompt_token_ids": ids + first}
    again = llm.generate(follow, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                         use_tqdm=False)
    hit = llm.engine.prefix_cache_stats.hit_tokens - before
    assert hit >= (len(ids) + len(first) - 1) // 4 * 4 - 4  # all but the last block or so
    sync = _llm(ckpt, block_size=4).generate(follow, SamplingParams(
        temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert _tokens(again) == _tokens(sync)
    assert llm.engine.num_used_blocks == 0


def test_abort_while_in_flight(llm, prompts):
    e = llm.engine
    p = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
    e.add_request("x", prompts[4], p)
    e.add_request("y", prompts[5], p)
    for _ in range(3):
        e.step()
    e.abort_request("x")  # its step is in flight
    outs = []
    while e.has_unfinished_requests():
        outs += e.step()
    assert [o.request_id for o in outs if o.finished] == ["y"]
    assert e.num_used_blocks == 0


def test_feedback_requests_match_sync(ckpt, llm, prompts):
    """Penalties and min_tokens need no token on the host (counts on the device, the pending
    count on the host): such requests overlap like any other and match step-by-step
    execution."""
    params = [SamplingParams(temperature=0.0, max_tokens=12, repetition_penalty=1.3,
                             ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=12, min_tokens=6),
              GREEDY]
    sync = _llm(ckpt).generate(prompts[:3], params, use_tqdm=False)
    assert _tokens(llm.generate(prompts[:3], params, use_tqdm=False)) == _tokens(sync)
    assert llm.engine.num_used_blocks == 0


def test_seeded_sampling_and_logprobs_match_sync(ckpt, llm, prompts):
    p = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=10, seed=3, logprobs=2,
                       ignore_eos=True)
    a = llm.generate(prompts[:4], p, use_tqdm=False)
    b = _llm(ckpt).generate(prompts[:4], p, use_tqdm=False)
    assert _tokens(a) == _tokens(b)
    for x, y in zip(a, b):
        for da, db in zip(x.outputs[0].logprobs, y.outputs[0].logprobs):
            assert da.keys() == db.keys()
            for k in da:
                assert da[k].logprob == pytest.approx(db[k].logprob, abs=1e-5)


def test_streaming_server_engine(ckpt):
    """The server's AsyncLLM over an async-scheduling engine: streamed deltas add up to the
    final output, which matches a step-by-step engine."""
    import asyncio

    from compiled_llm.config import EngineArgs
    from compiled_llm.entrypoints.async_llm import AsyncLLM
    from compiled_llm.sampling_params import RequestOutputKind as Kind

    def run(async_scheduling: bool, kind: Kind):
        eng = AsyncLLM(EngineArgs(model=str(ckpt), enforce_eager=True, dtype="float32",
                                  async_scheduling=async_scheduling))
        params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                                output_kind=kind)

        async def main():
            return [o async for o in eng.generate([5, 9, 17, 3], params, "r")]

        try:
            return asyncio.run(main()), eng.engine.num_used_blocks
        finally:
            eng.shutdown()

    deltas, used = run(True, Kind.DELTA)
    (final,), _ = run(False, Kind.FINAL_ONLY)
    assert sum((o.outputs[0].token_ids for o in deltas), []) == final.outputs[0].token_ids
    assert deltas[-1].finished and used == 0
