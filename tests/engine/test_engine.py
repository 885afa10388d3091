"""Engine behaviour on a tiny checkpoint: chunked prefill, preemption, seeds, n, stops, abort."""

from __future__ import annotations

import pytest

from compiled_llm import LLM, SamplingParams
from tests.utils import make_checkpoint, random_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def ckpt():
    return make_checkpoint("llama")


@pytest.fixture(scope="module")
def llm(ckpt):
    return LLM(str(ckpt), enforce_eager=True, dtype="float32")


@pytest.fixture(scope="module")
def prompts(llm):
    return [{"prompt_token_ids": p} for p in random_prompts(8, 300, lo=5, hi=120)]


@pytest.fixture(scope="module")
def baseline(llm, prompts):
    return _tokens(llm.generate(prompts, GREEDY, use_tqdm=False))


def test_chunked_prefill_same_output(ckpt, prompts, baseline):
    small = LLM(str(ckpt), enforce_eager=True, dtype="float32", max_num_batched_tokens=16)
    assert _tokens(small.generate(prompts, GREEDY, use_tqdm=False)) == baseline
    assert small.engine.num_used_blocks == 0


def test_preemption_same_output(ckpt, prompts, baseline):
    tight = LLM(str(ckpt), enforce_eager=True, dtype="float32", num_gpu_blocks_override=14)
    outs = tight.generate(prompts, GREEDY, use_tqdm=False)
    assert _tokens(outs) == baseline
    assert tight.engine.scheduler.num_preemptions > 0
    assert tight.engine.num_used_blocks == 0


def test_seed_same_alone_and_in_batch(llm, prompts):
    seeded = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=20, seed=1234, ignore_eos=True)
    alone = llm.generate(prompts[0], seeded, use_tqdm=False)[0].outputs[0]
    others = [SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True)] * 15
    batch = llm.generate(prompts[:1] + [prompts[i % 8] for i in range(1, 16)],
                         [seeded, *others], use_tqdm=False)
    assert batch[0].outputs[0].token_ids == alone.token_ids
    assert batch[0].outputs[0].text == alone.text
    assert llm.engine.num_used_blocks == 0


def test_n_and_logprobs(llm, prompts):
    p = SamplingParams(n=3, temperature=1.0, max_tokens=8, seed=7, logprobs=2, ignore_eos=True)
    out = llm.generate(prompts[1], p, use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    for c in out.outputs:
        assert len(c.token_ids) == 8 and len(c.logprobs) == 8
        for tok, lp in zip(c.token_ids, c.logprobs):
            assert tok in lp and 2 <= len(lp) <= 3 and lp[tok].logprob <= 0
        assert c.cumulative_logprob == pytest.approx(
            sum(d[t].logprob for d, t in zip(c.logprobs, c.token_ids)))
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1


def test_stop_token_ids_and_max_tokens(llm, prompts, baseline):
    stop_tok = baseline[2][5]
    first = baseline[2].index(stop_tok)
    p = SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=[stop_tok], ignore_eos=True)
    out = llm.generate(prompts[2], p, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == baseline[2][: first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_tok
    out = llm.generate(prompts[2], GREEDY, use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 24


def test_min_tokens_bans_stop_ids(llm, prompts, baseline):
    stop_tok = baseline[3][0]
    p = SamplingParams(temperature=0.0, max_tokens=10, min_tokens=4, stop_token_ids=[stop_tok])
    out = llm.generate(prompts[3], p, use_tqdm=False)[0].outputs[0]
    assert stop_tok not in out.token_ids[:4]


def test_stop_strings(llm):
    prompt = "The quick brown fox"
    free = llm.generate(prompt, GREEDY, use_tqdm=False)[0].outputs[0]
    assert len(free.text) > 6
    stop = free.text[3:6]
    cut = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=24, stop=[stop]),
                       use_tqdm=False)[0].outputs[0]
    assert cut.text == free.text[: free.text.index(stop)]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    keep = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=24, stop=[stop],
                                               include_stop_str_in_output=True),
                        use_tqdm=False)[0].outputs[0]
    assert keep.text == free.text[: free.text.index(stop) + len(stop)]
    assert llm.engine.num_used_blocks == 0


def test_text_prompt_and_chat(llm):
    out = llm.generate(["Hello world", "Permission"], GREEDY, use_tqdm=False)
    tok = llm.get_tokenizer()
    assert out[0].prompt == "Hello world" and out[0].prompt_token_ids == tok.encode("Hello world")
    assert out[1].outputs[0].text == tok.decode(out[1].outputs[0].token_ids,
                                                skip_special_tokens=True)
    chat = llm.chat([{"role": "user", "content": "hi"}], GREEDY, use_tqdm=False)[0]
    assert chat.prompt_token_ids == tok.encode("<user>hi\n<assistant>")


def test_bad_input_leaves_engine_clean(llm, prompts):
    with pytest.raises(ValueError, match="prompt"):
        llm.generate({"prompt_token_ids": [10**7]}, GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate({"prompt_token_ids": [5] * 600}, GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    assert not llm.engine.has_unfinished_requests()
    assert llm.engine.num_used_blocks == 0


def test_abort_frees_blocks(llm, prompts):
    eng = llm.engine
    eng.add_request("a", prompts[0], GREEDY)
    eng.add_request("b", prompts[1], GREEDY)
    eng.step()
    assert eng.num_used_blocks > 0
    eng.abort_request("a")
    while eng.has_unfinished_requests():
        eng.step()
    assert eng.num_used_blocks == 0


def test_abort_takes_a_list_of_ids(llm, prompts):
    """vLLM v1's LLMEngine.abort_request takes a list of ids; an n > 1 request's children go
    with their parent, and an unknown id is skipped."""
    eng = llm.engine
    eng.add_request("l1", prompts[0], GREEDY)
    eng.add_request("l2", prompts[1], SamplingParams(n=2, seed=1, max_tokens=24))
    eng.add_request("l3", prompts[2], SamplingParams(temperature=0.0, max_tokens=3))
    eng.step()
    assert eng.abort_request(["l1", "l2", "unknown"]) is None
    finished = {}
    while eng.has_unfinished_requests():
        finished.update({o.request_id: o for o in eng.step() if o.finished})
    assert set(finished) <= {"l3"} and eng.num_used_blocks == 0
    names = {m.name for m in eng.get_metrics()}  # vLLM v1's LLMEngine.get_metrics
    assert names == {m.name for m in llm.get_metrics()} and "vllm:num_requests_running" in names


def test_step_stats_count_model_steps(llm):
    """Every step that runs the model is timed; empty steps and warm-up are not."""
    eng = llm.engine
    before = eng.step_stats
    eng.add_request("timed", {"prompt_token_ids": [5, 6, 7, 8]},
                    SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    steps = 0
    while eng.has_unfinished_requests():
        eng.step()
        steps += 1
    eng.step()  # nothing scheduled: not counted
    w = eng.step_stats - before
    # under async scheduling one more step only reads the last launched one (not timed)
    assert steps == 6 + eng.args.async_scheduling
    assert w.steps == 6 and w.gpu_steps == 6
    assert min(w.schedule_s, w.prepare_s, w.output_s) >= 0 and w.forward_s > 0
    assert 0 < w.gpu_s <= w.forward_s
    ms = w.per_step_ms()
    assert ms["cpu_ms"] == pytest.approx(1e3 * w.cpu_s / 6)
    assert eng.num_used_blocks == 0


def test_generate_asks_engine_for_final_outputs_only(llm, prompts, baseline):
    """Offline generate needs finished outputs only: engine steps return nothing for running
    requests (no O(tokens) copy a request a step), the caller's params stay untouched."""
    from compiled_llm.sampling_params import RequestOutputKind

    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    seen: list = []
    step = llm.engine.step
    llm.engine.step = lambda: _record(step, seen)
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
    finally:
        del llm.engine.step
    assert _tokens(outs) == baseline
    assert params.output_kind == RequestOutputKind.CUMULATIVE
    assert seen and all(o.finished for o in seen)
    assert llm.engine.num_used_blocks == 0


def _record(step, seen):
    outs = step()
    seen.extend(outs)
    return outs
