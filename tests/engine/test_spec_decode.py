"""Speculative decoding end to end on a tiny Llama: greedy output token for token as without
it (n-gram and draft model, against transformers too), chunked prefill and preemption, stops,
sampled output following the target's distribution (total variation against the exact
distribution), seeds, requests that take no drafts, metrics, and the pool empty after each."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from compiled_llm import LLM, SamplingParams
from tests.utils import hf_greedy, make_checkpoint, random_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
         "prompt_lookup_min": 1}


def _tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


def _llm(ckpt, **kwargs):
    # the core in this process (CUDA's default is a process of its own): the tests read the
    # scheduler's spec stats and the KV pool through llm.engine
    kwargs.setdefault("engine_core_process", False)
    return LLM(str(ckpt), enforce_eager=True, dtype="float32", **kwargs)


@pytest.fixture(scope="module")
def ckpt():
    return make_checkpoint("llama")


@pytest.fixture(scope="module")
def prompts():
    # copy-heavy: every prompt repeats itself, so prompt lookup finds spans to propose
    return [{"prompt_token_ids": p + p} for p in random_prompts(6, 300, lo=4, hi=40)]


@pytest.fixture(scope="module")
def baseline(ckpt, prompts):
    return _tokens(_llm(ckpt).generate(prompts, GREEDY, use_tqdm=False))


@pytest.fixture(scope="module")
def ngram(ckpt):
    return _llm(ckpt, speculative_config=NGRAM)


@pytest.fixture(scope="module")
def draft(ckpt):
    return _llm(ckpt, speculative_config={"method": "draft_model", "model": str(ckpt),
                                          "num_speculative_tokens": 3})


def _metrics(llm):
    return {m.name: m.value for m in llm.get_metrics()}


def test_ngram_greedy_equals_spec_off(ngram, prompts, baseline):
    assert _tokens(ngram.generate(prompts, GREEDY, use_tqdm=False)) == baseline
    assert ngram.engine.num_used_blocks == 0
    stats = ngram.engine.scheduler.spec_stats
    assert stats.num_accepted_tokens > 0 and stats.num_draft_tokens > stats.num_accepted_tokens


def test_draft_model_greedy_equals_spec_off_with_full_acceptance(draft, prompts, baseline):
    before = _metrics(draft)
    assert _tokens(draft.generate(prompts, GREEDY, use_tqdm=False)) == baseline
    assert draft.engine.num_used_blocks == 0
    after = _metrics(draft)
    drafted = after["vllm:spec_decode_num_draft_tokens"] - before.get(
        "vllm:spec_decode_num_draft_tokens", 0)
    accepted = after["vllm:spec_decode_num_accepted_tokens"] - before.get(
        "vllm:spec_decode_num_accepted_tokens", 0)
    assert drafted > 0 and accepted == drafted  # the target as its own draft: all accepted


def test_greedy_matches_transformers(ngram, ckpt, prompts):
    ids = [p["prompt_token_ids"] for p in prompts[:2]]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    assert _tokens(ngram.generate(prompts[:2], params, use_tqdm=False)) == hf_greedy(ckpt, ids, 12)


def test_chunked_prefill_and_preemption(ckpt, prompts, baseline):
    tight = _llm(ckpt, speculative_config=NGRAM, max_num_batched_tokens=16,
                 num_gpu_blocks_override=14)
    assert _tokens(tight.generate(prompts, GREEDY, use_tqdm=False)) == baseline
    assert tight.engine.scheduler.num_preemptions > 0
    assert tight.engine.scheduler.spec_stats.num_accepted_tokens > 0
    assert tight.engine.num_used_blocks == 0


def test_prompt_logprobs_of_every_chunk(ckpt):
    """Chunked prefill under async scheduling (the default) with n-gram drafts: two steps'
    chunks can land before an output is taken, and both reach prompt_logprobs."""
    prompt = random_prompts(1, 300, lo=51, hi=52, seed=101)[0]
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([prompt])).logits[0], -1)
    llm = _llm(ckpt, speculative_config=NGRAM, max_num_batched_tokens=16)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, prompt_logprobs=0)
    out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
    assert len(out.prompt_logprobs) == len(prompt) and out.prompt_logprobs[0] is None
    for pos, row in enumerate(out.prompt_logprobs[1:], start=1):
        assert list(row) == [prompt[pos]]
        assert row[prompt[pos]].logprob == pytest.approx(ref[pos - 1, prompt[pos]].item(),
                                                         abs=1e-4)
    assert llm.engine.num_used_blocks == 0


def test_stops_apply_to_accepted_tokens(ngram, prompts, baseline):
    for i in range(3):
        stop_tok = baseline[i][9]
        first = baseline[i].index(stop_tok)
        params = SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=[stop_tok],
                                ignore_eos=True)
        out = ngram.generate(prompts[i], params, use_tqdm=False)[0].outputs[0]
        assert out.token_ids == baseline[i][:first + 1] and out.stop_reason == stop_tok
    lengths = ngram.generate(prompts, SamplingParams(temperature=0.0, max_tokens=7,
                                                     ignore_eos=True), use_tqdm=False)
    assert _tokens(lengths) == [b[:7] for b in baseline]
    text = ngram.generate(prompts[0], GREEDY, use_tqdm=False)[0].outputs[0].text
    stop = text[4:7]
    cut = ngram.generate(prompts[0], SamplingParams(temperature=0.0, max_tokens=24, stop=[stop],
                                                    ignore_eos=True), use_tqdm=False)
    assert cut[0].outputs[0].text == text[:text.index(stop)]
    assert ngram.engine.num_used_blocks == 0


def test_requests_without_drafts_decode_as_usual(ngram, prompts, baseline):
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=1)
    outs = ngram.generate(prompts[:2], params, use_tqdm=False)
    assert _tokens(outs) == baseline[:2]
    assert all(len(o.outputs[0].logprobs) == 24 for o in outs)


def _count_async_launches(llm) -> list:
    launched = []
    executor = llm.engine.executor
    plain_launch = executor.launch_forward
    executor.launch_forward = lambda *a, **kw: launched.append(1) or plain_launch(*a, **kw)
    return launched


def test_disable_by_batch_size_switches_between_async_and_verify_steps(ckpt, prompts,
                                                                      baseline):
    # 6 requests of different lengths at a limit of 4: the full batch decodes async without
    # drafts, then speculation resumes (in the same requests) as requests finish
    llm = _llm(ckpt, speculative_config={**NGRAM, "disable_by_batch_size": 4})
    launched = _count_async_launches(llm)
    lengths = [4, 8, 12, 24, 24, 24]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
    assert _tokens(llm.generate(prompts, params, use_tqdm=False)) == [
        b[:n] for b, n in zip(baseline, lengths)]
    assert len(launched) >= 4  # async steps ran while the batch was at the limit
    assert llm.engine.scheduler.spec_stats.num_accepted_tokens > 0  # and verify steps after
    assert llm.engine.num_used_blocks == 0
    sync = _llm(ckpt, speculative_config={**NGRAM, "disable_by_batch_size": 6},
                async_scheduling=False)  # the limit holds in synchronous steps too
    assert _tokens(sync.generate(prompts, GREEDY, use_tqdm=False)) == baseline
    assert sync.engine.scheduler.spec_stats.num_drafts == 0
    assert sync.engine.num_used_blocks == 0


def test_fruitless_lookups_pause_into_async_steps(ckpt):
    # prompts without repeated trigrams: lookups find little, so speculation pauses (async
    # steps) and resumes; greedy output stays exact, also with async scheduling off
    plain = [{"prompt_token_ids": p} for p in random_prompts(4, 300, lo=20, hi=40, seed=9)]
    spec = {**NGRAM, "prompt_lookup_min": 3}
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    llm = _llm(ckpt, speculative_config=spec)
    launched = _count_async_launches(llm)
    want = _tokens(_llm(ckpt).generate(plain, params, use_tqdm=False))
    assert _tokens(llm.generate(plain, params, use_tqdm=False)) == want
    assert len(launched) > 10
    sync = _llm(ckpt, speculative_config=spec, async_scheduling=False)
    assert _tokens(sync.generate(plain, params, use_tqdm=False)) == want
    assert llm.engine.num_used_blocks == sync.engine.num_used_blocks == 0



def test_a_batch_from_idle_speculates_despite_an_earlier_fruitless_one(ckpt, prompts):
    # a fruitless workload leaves a pause of up to max_pause steps behind; the next request,
    # arriving at an idle engine, must look its own drafts up rather than wait the old pause
    # out (all of a short reply) in silence
    plain = [{"prompt_token_ids": p} for p in random_prompts(2, 300, lo=30, hi=40, seed=9)]
    llm = _llm(ckpt, speculative_config={**NGRAM, "prompt_lookup_min": 2})
    llm.generate(plain, SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True),
                 use_tqdm=False)
    scheduler = llm.engine.scheduler
    assert scheduler.pause.length > 1  # the lookups were fruitless: pauses grew
    # where a longer fruitless run ends (how far into a pause is the run's luck)
    scheduler.pause.pause = scheduler.pause.length = scheduler.pause.max_pause
    drafted = scheduler.spec_stats.num_draft_tokens
    short = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    llm.generate(prompts[0], short, use_tqdm=False)
    assert scheduler.spec_stats.num_draft_tokens > drafted
    assert llm.engine.num_used_blocks == 0


def test_a_draft_that_does_not_load_is_refused_naming_the_field(ckpt, tmp_path):
    # the loader's own message names the target's "model"; the user set speculative_config's
    for draft in ("/nonexistent/draft", str(tmp_path)):
        with pytest.raises(ValueError, match=r"^speculative_config\.model: "):
            _llm(ckpt, speculative_config={"model": draft, "num_speculative_tokens": 2})

def test_seeded_sampling_repeats(draft, prompts):
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, seed=99, ignore_eos=True)
    first = _tokens(draft.generate(prompts[:3], params, use_tqdm=False))
    assert _tokens(draft.generate(prompts[:3], params, use_tqdm=False)) == first


def test_seeded_output_does_not_depend_on_the_batch(ngram, prompts):
    # with n-gram lookups, fruitless steps pause speculation for the whole batch; a seeded
    # request must still draw the same tokens alone as beside unseeded requests (as in vLLM)
    seeded = SamplingParams(temperature=1.0, max_tokens=16, seed=11, ignore_eos=True)
    plain = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    alone = _tokens(ngram.generate(prompts[0], seeded, use_tqdm=False))[0]
    batch = ngram.generate(prompts[:5], [seeded] + [plain] * 4, use_tqdm=False)
    assert _tokens(batch)[0] == alone
    assert ngram.engine.num_used_blocks == 0


def test_metrics_names_and_values(ngram):
    metrics = {m.name: m for m in ngram.get_metrics()}
    stats = ngram.engine.scheduler.spec_stats
    assert metrics["vllm:spec_decode_num_drafts"].value == stats.num_drafts
    assert metrics["vllm:spec_decode_num_draft_tokens"].value == stats.num_draft_tokens
    assert metrics["vllm:spec_decode_num_accepted_tokens"].value == stats.num_accepted_tokens
    per_pos = metrics["vllm:spec_decode_num_accepted_tokens_per_pos"].values
    assert len(per_pos) == 3 and sum(per_pos) == stats.num_accepted_tokens
    assert per_pos == sorted(per_pos, reverse=True)  # position i needs positions < i accepted
    assert metrics["vllm:num_requests_running"].value == 0


def _exact_joint(ckpt, prompt: list[int], top_k: int, depth: int) -> dict[tuple, float]:
    """P(t0..t_depth-1) of sampling at temperature 1 with top_k, from transformers."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt).eval()

    def dist(ids):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        top = logits.topk(top_k)
        return dict(zip(top.indices.tolist(), torch.softmax(top.values, -1).tolist()))

    joint = {(): 1.0}
    for _ in range(depth):
        joint = {seq + (tok,): prob * p for seq, prob in joint.items()
                 for tok, p in dist(prompt + list(seq)).items()}
    return joint


def _tv(seen: list[tuple], exact: dict[tuple, float]) -> float:
    counts = dict.fromkeys(exact, 0)
    for seq in seen:
        counts[seq] += 1  # KeyError: a sequence the target could never produce
    return 0.5 * sum(abs(counts[seq] / len(seen) - prob) for seq, prob in exact.items())


def test_sampled_output_follows_the_target_distribution(ckpt):
    # a different random model as the draft: its drafts are often rejected, so acceptance,
    # the recovered draw and the bonus draw all take part. The attention of the CPU backend
    # costs per sequence, so the sample is small (the verifier's own test draws 20000 each)
    other = make_checkpoint("qwen2")
    llm = _llm(ckpt, speculative_config={"method": "draft_model", "model": str(other),
                                         "num_speculative_tokens": 2})
    prompt = random_prompts(1, 300, lo=6, hi=7, seed=3)[0]
    params = SamplingParams(temperature=1.0, top_k=2, max_tokens=3, ignore_eos=True)
    num = 250
    seen = [tuple(t) for t in _tokens(llm.generate([{"prompt_token_ids": prompt}] * num,
                                                   params, use_tqdm=False))]
    exact = _exact_joint(ckpt, prompt, 2, 3)
    assert _tv(seen, exact) < 0.15  # E[TV] is about 0.07 for 8 cells and 250 draws
    pairs: dict[tuple, float] = {}
    for seq, prob in exact.items():
        pairs[seq[:2]] = pairs.get(seq[:2], 0.0) + prob
    assert _tv([seq[:2] for seq in seen], pairs) < 0.1  # E[TV] about 0.045
    stats = llm.engine.scheduler.spec_stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert llm.engine.num_used_blocks == 0


@pytest.mark.slow
def test_engine_core_process(ckpt, prompts, baseline):
    with _llm(ckpt, speculative_config=NGRAM, engine_core_process=True) as llm:
        assert _tokens(llm.generate(prompts[:3], GREEDY, use_tqdm=False)) == baseline[:3]
        metrics = _metrics(llm)
        assert metrics["vllm:spec_decode_num_accepted_tokens"] > 0
        assert len(metrics["vllm:spec_decode_num_accepted_tokens_per_pos"]) == 3
        assert llm.engine.num_used_blocks == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("method, limit", [("ngram", None), ("ngram", 4),
                                           ("draft_model", None)])
def test_cuda_graphs_greedy_equal(ckpt, prompts, method, limit):
    """Compiled with CUDA graphs: greedy equals spec off; verify steps where every request
    has k drafts (k+1 query tokens each; always so with a draft model) replay full verify
    graphs, the others piecewise graphs; with disable_by_batch_size the full batch decodes
    async first."""
    from compiled_llm.compile.counters import counters

    # with a limit, requests of different lengths: speculation resumes as the batch shrinks
    params = GREEDY if limit is None else [
        SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        for n in (4, 8, 12, 24, 24, 24)]
    with LLM(str(ckpt), dtype="float32", engine_core_process=False) as plain:
        baseline = _tokens(plain.generate(prompts, params, use_tqdm=False))
    spec = {"method": method, "num_speculative_tokens": 3, **(
        {"model": str(ckpt)} if method == "draft_model" else
        {"prompt_lookup_max": 3, "prompt_lookup_min": 1, "disable_by_batch_size": limit})}
    with LLM(str(ckpt), dtype="float32", speculative_config=spec,
             engine_core_process=False) as llm:
        before, verify = counters.piecewise_steps, counters.verify_graph_replays
        assert _tokens(llm.generate(prompts, params, use_tqdm=False)) == baseline
        assert counters.piecewise_steps > before  # the prefills
        assert method == "ngram" or counters.verify_graph_replays > verify
        stats = llm.engine.scheduler.spec_stats
        assert stats.num_accepted_tokens > 0
        assert method == "ngram" or stats.num_accepted_tokens == stats.num_draft_tokens
        assert llm.engine.num_used_blocks == 0
        if method == "ngram":  # on CUDA the lookup runs on the device
            from compiled_llm.sample.spec_decode.ngram_device import DeviceNgramProposer

            proposer = llm.engine.executor.spec_runner.proposer
            assert isinstance(proposer, DeviceNgramProposer)
