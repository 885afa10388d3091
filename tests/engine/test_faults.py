"""Faults stay contained: a logits processor or detokenizer that raises fails its request alone;
a model step that raises fails that step's requests, frees their blocks, and the engine goes on."""

from __future__ import annotations

import copy

import pytest

from compiled_llm import LLM, SamplingParams
from compiled_llm.core.request import RequestStatus
from tests.utils import make_checkpoint, random_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    return LLM(str(make_checkpoint("llama")), enforce_eager=True, dtype="float32")


@pytest.fixture(scope="module")
def prompts():
    return [{"prompt_token_ids": p} for p in random_prompts(4, 300, lo=20, hi=50, seed=5)]


@pytest.fixture(scope="module")
def baseline(llm, prompts):
    return [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


def run_all(eng) -> dict:
    done = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out
    return done


def check_others(done, baseline, bad: str) -> None:
    for rid, out in done.items():
        if rid != bad:
            assert out.error is None
            assert out.outputs[0].token_ids == baseline[int(rid)]
            assert out.outputs[0].finish_reason == "length"


def test_a_raising_logits_processor_fails_only_its_request(llm, prompts, baseline):
    calls = []

    def bad(output_ids, logits):
        calls.append(len(output_ids))
        if len(output_ids) == 3:
            raise RuntimeError("boom in processor")
        return logits

    params = [GREEDY] * 4
    params[1] = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True,
                               logits_processors=[bad])
    outs = llm.generate(prompts, params, use_tqdm=False)
    failed = outs[1]
    assert failed.finished and "boom in processor" in failed.error
    assert "logits processor" in failed.error
    assert failed.outputs[0].finish_reason == "error"
    assert failed.outputs[0].token_ids == baseline[1][:3]  # tokens before the fault stand
    assert calls == [0, 1, 2, 3]
    check_others({str(i): o for i, o in enumerate(outs)}, baseline, "1")
    assert llm.engine.num_used_blocks == 0


def test_an_interrupted_generate_leaves_no_request_behind(llm, prompts, baseline):
    """Ctrl-C inside LLM.generate (here from a logits processor, once) aborts the call's
    requests: no KV block stays held and the next call runs only its own."""
    fired = []

    def interrupt(output_ids, logits):
        if len(output_ids) == 2 and not fired:
            fired.append(1)
            raise KeyboardInterrupt
        return logits

    params = [GREEDY] * 4
    params[2] = SamplingParams(temperature=0.0, max_tokens=8, logits_processors=[interrupt])
    with pytest.raises(KeyboardInterrupt):
        llm.generate(prompts, params, use_tqdm=False)
    eng = llm.engine
    assert not eng.has_unfinished_requests() and eng.num_used_blocks == 0
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == baseline


def test_a_raising_detokenizer_fails_only_its_request(llm, prompts, baseline):
    eng = llm.engine
    for i, p in enumerate(prompts):
        eng.add_request(str(i), p, GREEDY)
    victim = eng.scheduler.requests["2"]
    state = eng.outputs.states["2"]

    def broken(token_ids):
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")

    state.detokenizer.add_tokens = broken  # fault injection for this one request
    done = run_all(eng)
    assert set(done) == {"0", "1", "2", "3"}
    assert "output processing failed" in done["2"].error
    assert "UnicodeDecodeError" in done["2"].error
    assert done["2"].outputs[0].finish_reason == "error"
    assert len(done["2"].outputs[0].token_ids) == 1  # failed on its first token
    assert victim.status is RequestStatus.FINISHED_ERROR and victim.block_ids == []
    check_others(done, baseline, "2")
    assert eng.num_used_blocks == 0


@pytest.mark.parametrize("fail_call", [1, 3], ids=["prefill", "decode"])
def test_a_failed_model_step_fails_its_requests_and_the_engine_goes_on(
        llm, prompts, baseline, fail_call):
    eng = llm.engine
    eng.reset_prefix_cache()
    runner = eng.executor.worker.runner
    real = runner.run_forward
    state = {"calls": 0}

    def flaky(inputs, **kwargs):
        state["calls"] += 1
        if state["calls"] == fail_call:
            raise RuntimeError("injected device fault")
        return real(inputs, **kwargs)

    runner.run_forward = flaky
    try:
        for i in (0, 1):
            eng.add_request(str(i), prompts[i], GREEDY)
        failed = {}
        while not failed:
            failed = {o.request_id: o for o in eng.step() if o.finished}
        for i in (2, 3):  # arrivals after the fault are served normally
            eng.add_request(str(i), prompts[i], GREEDY)
        done = {**failed, **run_all(eng)}
    finally:
        del runner.run_forward
    for rid in ("0", "1"):
        assert "model step failed" in done[rid].error
        assert "injected device fault" in done[rid].error
        assert done[rid].outputs[0].finish_reason == "error"
    check_others({k: v for k, v in done.items() if k in ("2", "3")}, baseline, "")
    assert eng.num_used_blocks == 0
    # blocks the failed step was filling were not kept cached: a rerun computes them afresh
    again = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in again] == baseline
    assert all(o.error is None for o in again)
    assert eng.num_used_blocks == 0


# data a bug upstream of the sampler could leave on a request, past validation
SAMPLER_FAULTS = {
    "stop_id_outside_vocab": {"stop_token_ids": [10 ** 6], "min_tokens": 8},
    "logit_bias_outside_vocab": {"logit_bias": {10 ** 6: 1.0}},
    "allowed_id_outside_vocab": {"allowed_token_ids": [3, 10 ** 6]},
    "top_k_past_int64": {"top_k": 2 ** 70, "temperature": 1.0},
    "seed_past_int64": {"seed": 2 ** 70, "temperature": 1.0},
}


@pytest.mark.parametrize("fault", SAMPLER_FAULTS)
def test_item2_a_bad_row_in_the_sampler_fails_its_request_alone(llm, prompts, baseline, fault):
    eng = llm.engine
    for i, p in enumerate(prompts):
        eng.add_request(str(i), p, GREEDY)
    victim = eng.scheduler.requests["2"]
    victim.sampling_params = copy.copy(GREEDY)  # its own params, edited past validation
    for name, value in SAMPLER_FAULTS[fault].items():
        setattr(victim.sampling_params, name, value)
    done = run_all(eng)
    assert set(done) == {"0", "1", "2", "3"}
    assert done["2"].error.startswith("sampling failed"), done["2"].error
    assert done["2"].outputs[0].finish_reason == "error" and victim.block_ids == []
    check_others(done, baseline, "2")
    assert eng.num_used_blocks == 0


def test_item2_a_bad_row_in_the_input_batch_fails_its_request_alone(llm, prompts, baseline):
    eng = llm.engine
    eng.reset_prefix_cache()
    for i, p in enumerate(prompts):
        eng.add_request(str(i), p, GREEDY)
    victim = eng.scheduler.requests["1"]
    victim.all_token_ids[3] = 10 ** 6  # an id the embedding cannot look up
    done = run_all(eng)
    assert "token ids outside the vocabulary" in done["1"].error
    assert done["1"].outputs[0].token_ids == [] and victim.block_ids == []
    check_others(done, baseline, "1")
    assert eng.num_used_blocks == 0
    # the blocks the victim was to fill were not cached: its prompt reruns afresh
    again = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in again] == baseline



def test_a_prefill_chunk_that_fails_to_land_keeps_none_of_its_blocks_cached():
    """Async scheduling counts a step's tokens at launch: when reading the results of a
    prompt's second chunk fails (its third chunk already launched), the blocks of both lose
    their hashes, and only the first chunk's block, which landed, is hit by a rerun."""
    llm = LLM(str(make_checkpoint("llama")), enforce_eager=True, dtype="float32",
              max_num_batched_tokens=16)
    eng, prompt = llm.engine, {"prompt_token_ids": random_prompts(1, 300, 48, 49, seed=3)[0]}
    runner = eng.executor.worker.runner
    real, state = runner.finish, {"calls": 0}

    def flaky(step):
        state["calls"] += 1
        if state["calls"] == 2:  # the second chunk's
            raise RuntimeError("injected landing fault")
        return real(step)

    runner.finish = flaky
    try:
        eng.add_request("0", prompt, GREEDY)
        done = run_all(eng)
    finally:
        del runner.finish
    assert "injected landing fault" in done["0"].error and eng.num_used_blocks == 0
    again = llm.generate(prompt, GREEDY, use_tqdm=False)[0]
    assert again.num_cached_tokens == 16 and again.error is None
    assert eng.num_used_blocks == 0
