"""Prompt logprobs against transformers (float32) with chunked prefill and prefix caching on:
every position scored once, ranks and top ids right, a cached prefix recomputed rather than
skipped, n > 1 reported once, and the pool empty afterwards."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from compiled_llm import LLM, SamplingParams
from tests.utils import make_checkpoint

TOP = 3


@pytest.fixture(scope="module")
def setup():
    import transformers

    checkpoint = make_checkpoint("llama")
    # a 16-token budget splits every prompt below into several prefill chunks
    llm = LLM(str(checkpoint), enforce_eager=True, dtype="float32", max_num_batched_tokens=16,
              max_num_seqs=4, enable_prefix_caching=True, block_size=16)
    hf = transformers.AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    return llm, hf


def _reference(hf, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([prompt])).logits[0].float().log_softmax(-1)


def _check(out, prompt: list[int], ref: torch.Tensor) -> None:
    rows = out.prompt_logprobs
    assert len(rows) == len(prompt) and rows[0] is None
    for pos, (row, token) in enumerate(zip(rows[1:], prompt[1:])):
        expected = ref[pos]
        chosen = row[token]
        torch.testing.assert_close(chosen.logprob, expected[token].item(), atol=1e-4, rtol=1e-4)
        assert chosen.rank == int((expected >= expected[token]).sum())
        assert chosen.decoded_token is not None
        top_ids = expected.topk(TOP).indices.tolist()
        ranked = sorted((lp.rank, tid) for tid, lp in row.items() if lp.rank <= TOP)
        assert [tid for _, tid in ranked][:TOP] == top_ids


def test_chunked_prefill_matches_transformers(setup):
    llm, hf = setup
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, 300, (n,), generator=g).tolist() for n in (5, 37, 70)]
    params = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=TOP)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        _check(out, prompt, _reference(hf, prompt))
    assert llm.engine.num_used_blocks == 0


def test_cached_prefix_is_recomputed_for_prompt_logprobs(setup):
    llm, hf = setup
    g = torch.Generator().manual_seed(4)
    shared = torch.randint(1, 300, (48,), generator=g).tolist()
    first, second = shared + [7, 8, 9], shared + [10, 11]
    warm = SamplingParams(temperature=0.0, max_tokens=1)
    llm.generate([{"prompt_token_ids": first}], warm, use_tqdm=False)  # caches 3 blocks
    before = replace(llm.engine.prefix_cache_stats)  # a copy: the core's object moves on
    hit = llm.generate([{"prompt_token_ids": second}], warm, use_tqdm=False)
    after_hit = replace(llm.engine.prefix_cache_stats)
    assert after_hit.hit_tokens - before.hit_tokens == 48  # the cache does serve this prefix
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=TOP)
    out = llm.generate([{"prompt_token_ids": second}], params, use_tqdm=False)[0]
    _check(out, second, _reference(hf, second))
    # the request that scored its prompt made no lookup, and generated what the cached one did
    assert llm.engine.prefix_cache_stats.requests == after_hit.requests
    assert out.outputs[0].token_ids == hit[0].outputs[0].token_ids
    assert llm.engine.num_used_blocks == 0


def test_n_children_share_one_prompt_logprob_list(setup):
    llm, hf = setup
    prompt = list(range(5, 45))
    params = SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=3, prompt_logprobs=0)
    out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
    assert len(out.outputs) == 3
    rows, ref = out.prompt_logprobs, _reference(hf, prompt)
    assert len(rows) == len(prompt) and rows[0] is None
    got = torch.tensor([row[t].logprob for row, t in zip(rows[1:], prompt[1:])])
    torch.testing.assert_close(got, ref[torch.arange(len(prompt) - 1), prompt[1:]],
                               atol=1e-4, rtol=1e-4)
    assert llm.engine.num_used_blocks == 0
