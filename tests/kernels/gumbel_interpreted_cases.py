"""The one-pass temperature sampler (sample/gumbel.py), run by test_interpreter.py under
TRITON_INTERPRET=1 in a subprocess, and natively on a GPU when named on pytest's command line:
its draws follow softmax(logits / T) (a total-variation bound that a wrong temperature fails),
greedy rows are the argmax, masked ids are never drawn, seeds repeat, and the Sampler takes it
only for rows it serves."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.attention.kernels import kernels_interpreted
from compiled_llm.sample.gumbel import gumbel_sample
from compiled_llm.sample.metadata import SamplingMetadata
from compiled_llm.sample.sampler import Sampler, make_generator

pytestmark = pytest.mark.skipif(not (kernels_interpreted() or torch.cuda.is_available()),
                                reason="needs TRITON_INTERPRET=1 or CUDA")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

VOCAB = 16


def frequencies(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.bincount(tokens, minlength=vocab).double() / tokens.numel()


def total_variation(first: torch.Tensor, second: torch.Tensor) -> float:
    return 0.5 * float((first - second).abs().sum())


def test_draws_follow_the_tempered_softmax():
    gen = torch.Generator().manual_seed(0)
    row = torch.randn(VOCAB, generator=gen) * 2
    rows = 1000
    logits = row.expand(rows, VOCAB).contiguous().to(DEVICE)
    tokens = gumbel_sample(logits, torch.full((rows,), 0.7, device=DEVICE), seed=1234)
    observed = frequencies(tokens.cpu(), VOCAB)
    # 0.07: above the 99.9th percentile (0.066) of 1,000 exact draws' distance
    assert total_variation(observed, torch.softmax(row.double() / 0.7, -1)) < 0.07
    # the bound has power: the untempered distribution is far from these draws
    assert total_variation(observed, torch.softmax(row.double(), -1)) > 0.1


def test_greedy_rows_masks_and_parts():
    gen = torch.Generator().manual_seed(1)
    vocab = 3000  # several parts per row: the merge across parts is exercised
    logits = torch.randn(4, vocab, generator=gen)
    logits[1, 2500] = 50.0  # a greedy row whose maximum sits in a later part
    logits[2, :] = float("-inf")
    logits[2, [7, 2999]] = 0.0  # only two ids allowed
    temperature = torch.tensor([0.0, 0.0, 1.0, 0.5])
    logits, temperature = logits.to(DEVICE), temperature.to(DEVICE)
    tokens = gumbel_sample(logits, temperature, seed=7).cpu()
    assert tokens[:2].tolist() == logits[:2].argmax(-1).tolist()
    assert tokens[2].item() in (7, 2999)
    again = gumbel_sample(logits, temperature, seed=7)
    assert torch.equal(tokens, again.cpu())


def test_bf16_logits_and_seed_changes_draws():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(64, VOCAB, generator=gen).to(DEVICE, torch.bfloat16)
    temperature = torch.ones(64, device=DEVICE)
    first = gumbel_sample(logits, temperature, seed=1)
    second = gumbel_sample(logits, temperature, seed=2)
    assert first.dtype == torch.int64 and not torch.equal(first, second)


def _meta(temperature, generators=None, top_k=None) -> SamplingMetadata:
    temperature = temperature.to(DEVICE)
    top_k = None if top_k is None else top_k.to(DEVICE)
    return SamplingMetadata(
        temperature=temperature, all_greedy=False, top_k=top_k, top_p=None, min_p=None,
        generators=generators or {}, presence_penalty=None, frequency_penalty=None,
        repetition_penalty=None, output_token_ids=[[] for _ in temperature],
        banned_token_ids={}, logits_processors={}, max_num_logprobs=None)


def test_sampler_uses_one_pass_only_where_it_serves():
    sampler = Sampler(DEVICE, VOCAB)
    assert sampler.one_pass
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, VOCAB, generator=gen).to(DEVICE)
    out = sampler(logits, _meta(torch.tensor([0.0, 1.0, 0.8])))
    assert out.sampled_token_ids[0].item() == logits[0].argmax().item()
    # a seeded row keeps its own generator's draws: the same as that row sampled alone
    seeded = sampler(logits, _meta(torch.tensor([1.0, 1.0, 1.0]),
                                   {1: make_generator(5, DEVICE)}))
    alone = sampler(logits[1:2], _meta(torch.tensor([1.0]), {0: make_generator(5, DEVICE)}))
    assert seeded.sampled_token_ids[1].item() == alone.sampled_token_ids[0].item()
    # top-k rows take the fused top-k kernel (fused_topk.py): only the top-1 id can come out
    top1 = sampler(logits, _meta(torch.ones(3), top_k=torch.ones(3, dtype=torch.int64)))
    assert top1.sampled_token_ids.tolist() == logits.argmax(-1).tolist()
