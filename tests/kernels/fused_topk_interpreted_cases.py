"""The sort-free top-k / top-p / min-p sampler (sample/fused_topk.py), run by test_interpreter.py
under TRITON_INTERPRET=1 in a subprocess, and natively on a GPU when named on pytest's command
line: its kept sets are the general path's masks (ties, top_k=1, tiny and full top_p, mixed
rows, greedy rows), its draws follow softmax(masked logits / T) (a total-variation bound that a
wrong cut or temperature fails), masked ids are never drawn, and the Sampler takes it for
unseeded rows with top-k, top-p or min-p."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.attention.kernels import kernels_interpreted
from compiled_llm.sample import fused_topk
from compiled_llm.sample.fused_topk import FUSED_TOP_P_MIN_ROWS, fused_topk_sample
from compiled_llm.sample.metadata import SamplingMetadata
from compiled_llm.sample.sampler import Sampler, apply_min_p, apply_top_k_top_p, make_generator

pytestmark = pytest.mark.skipif(not (kernels_interpreted() or torch.cuda.is_available()),
                                reason="needs TRITON_INTERPRET=1 or CUDA")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NEG_INF = float("-inf")


def reference_kept(logits, temperature, top_k, top_p, min_p) -> torch.Tensor:
    """The general path's kept set (Sampler.probs' masks) of float32 logits [B, V]."""
    scaled = logits.float() / torch.where(temperature < 1e-5, 1.0, temperature).unsqueeze(1)
    if min_p is not None:
        apply_min_p(scaled, min_p)
    apply_top_k_top_p(scaled, top_k, top_p)
    return scaled > NEG_INF


def kernel_kept(logits, temperature, top_k, top_p, min_p, seed=0):
    """(tokens, kept set) of the fused kernel on DEVICE."""
    kept = torch.zeros(logits.shape, dtype=torch.int8, device=DEVICE)
    on = [None if t is None else t.to(DEVICE) for t in (logits, temperature, top_k, top_p, min_p)]
    tokens = fused_topk_sample(*on, seed=seed, kept=kept)
    return tokens.cpu(), kept.cpu().bool()


def tied_logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """Random logits rounded to one decimal: many ties, at the cuts too."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, vocab, generator=gen) * 2).round(decimals=1)


@pytest.mark.parametrize("vocab", [257, 1100])  # one tile and several (BLOCK 512)
def test_kept_sets_match_the_general_path(vocab):
    temperature = torch.tensor([0.7, 1.0, 1.3, 0.5, 1.0, 0.9, 2.0, 1.0, 0.6, 1.1, 0.8, 1.0])
    top_k = torch.tensor([5, 0, 1, 50, vocab + 3, -1, 1, 3, 20, vocab, 7, 2])
    top_p = torch.tensor([0.9, 0.5, 1.0, 1e-6, 0.95, 1.0, 0.3, 1.0, 0.8, 0.99, 1e-9, 0.6])
    min_p = torch.tensor([0.0, 0.1, 0.0, 0.05, 0.2, 0.0, 0.0, 0.3, 0.02, 0.0, 0.0, 0.5])
    logits = tied_logits(len(temperature), vocab, seed=vocab)
    # every combination of parameters present / absent in the batch
    for k, p, m in [(top_k, top_p, min_p), (top_k, None, None), (None, top_p, None),
                    (None, None, min_p), (top_k, top_p, None), (None, top_p, min_p)]:
        expected = reference_kept(logits, temperature, k, p, m)
        _, kept = kernel_kept(logits, temperature, k, p, m)
        assert torch.equal(kept, expected), (k is None, p is None, m is None,
                                             (kept != expected).sum(1).tolist())


def test_greedy_rows_take_the_argmax_among_truncated_rows():
    logits = tied_logits(6, 300, seed=3)
    temperature = torch.tensor([0.0, 1.0, 0.0, 0.8, 0.0, 1.0])
    top_k = torch.tensor([1, 1, 4, 2, 0, 1])
    top_p = torch.tensor([0.5, 1.0, 0.1, 0.9, 1.0, 0.2])
    min_p = torch.tensor([0.2, 0.0, 0.0, 0.1, 0.9, 0.0])
    tokens, kept = kernel_kept(logits, temperature, top_k, top_p, min_p, seed=11)
    argmax = logits.argmax(-1)  # the lowest id among tied maxima
    assert tokens[[0, 2, 4]].tolist() == argmax[[0, 2, 4]].tolist()
    assert kept[[0, 2, 4]].all()  # greedy rows: nothing cut
    # top_k=1 keeps the maximum and its ties only
    for row in (1, 5):
        assert logits[row, tokens[row]] == logits[row].max()
    assert kept[3, tokens[3]]
    again, _ = kernel_kept(logits, temperature, top_k, top_p, min_p, seed=11)
    assert torch.equal(tokens, again)


def frequencies(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.bincount(tokens, minlength=vocab).double() / tokens.numel()


def total_variation(first: torch.Tensor, second: torch.Tensor) -> float:
    return 0.5 * float((first - second).abs().sum())


def masked_softmax(row, temperature, top_k, top_p, min_p) -> torch.Tensor:
    one = [None if v is None else torch.tensor([v]) for v in (top_k, top_p, min_p)]
    keep = reference_kept(row.unsqueeze(0), torch.tensor([temperature]), *one)[0]
    return torch.softmax((row.double() / temperature).masked_fill(~keep, NEG_INF), -1)


GROUPS = [(4, 1.0, 0.0), (0, 0.5, 0.0), (0, 1.0, 0.5)]  # (top_k, top_p, min_p), ~4 ids kept


def test_draws_follow_the_truncated_tempered_softmax():
    vocab, rows, temperature = 16, 300, 1.5
    row = torch.linspace(0.0, -4.5, vocab)  # flat at T: every cut drops much of the mass
    logits = row.expand(rows * len(GROUPS), vocab).contiguous()
    # one batch of mixed rows: each group of `rows` rows has its own parameters
    top_k, top_p, min_p = (torch.tensor(v).repeat_interleave(rows) for v in zip(*GROUPS))
    tokens = fused_topk_sample(*(t.to(DEVICE) for t in [logits, torch.full(
        (len(logits),), temperature), top_k, top_p, min_p]), seed=1234).cpu()
    for group, params in enumerate(GROUPS):
        observed = frequencies(tokens[group * rows:(group + 1) * rows], vocab)
        # 0.11: above the 99.9th percentile of 300 exact draws' distance
        assert total_variation(observed, masked_softmax(row, temperature, *params)) < 0.11
        # the bound has power: no cut, or a wrong temperature, is far from these draws
        untruncated = torch.softmax(row.double() / temperature, -1)
        assert total_variation(observed, untruncated) > 0.2
        assert total_variation(observed, masked_softmax(row, temperature / 5, *params)) > 0.2


def test_masked_ids_are_never_drawn():
    vocab, rows = 40, 64
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(rows, vocab, generator=gen) * 3
    banned = torch.rand(rows, vocab, generator=gen) < 0.6
    banned[:, 0] = True  # the largest logit of each row is banned
    logits[:, 0] = 20.0
    banned[:8] = True
    banned[:8, [3, 17]] = False  # rows with two allowed ids: top-k and top-p past them
    logits = logits.masked_fill(banned, NEG_INF)
    temperature = torch.rand(rows, generator=gen) + 0.3
    top_k = torch.randint(0, 12, (rows,), generator=gen)
    top_p = torch.where(torch.arange(rows) % 3 == 0, 1.0, torch.rand(rows, generator=gen))
    min_p = torch.where(torch.arange(rows) % 2 == 0, 0.0, torch.rand(rows, generator=gen) / 4)
    tokens, kept = kernel_kept(logits, temperature, top_k, top_p, min_p, seed=9)
    assert not banned.gather(1, tokens.unsqueeze(1)).any()
    expected = reference_kept(logits, temperature, top_k, top_p, min_p)
    assert torch.equal(kept & ~banned, expected & ~banned)


def _meta(temperature, top_k=None, top_p=None, generators=None) -> SamplingMetadata:
    return SamplingMetadata(
        temperature=temperature.to(DEVICE), all_greedy=False,
        top_k=None if top_k is None else top_k.to(DEVICE),
        top_p=None if top_p is None else top_p.to(DEVICE), min_p=None,
        generators=generators or {}, presence_penalty=None, frequency_penalty=None,
        repetition_penalty=None, output_token_ids=[[] for _ in temperature],
        banned_token_ids={}, logits_processors={}, max_num_logprobs=None)


def test_sampler_takes_the_fused_kernel_for_unseeded_truncated_rows(monkeypatch):
    calls = []
    real = fused_topk.fused_topk_sample
    monkeypatch.setattr(fused_topk, "fused_topk_sample",
                        lambda *args, **kw: calls.append(1) or real(*args, **kw))
    logits = tied_logits(3, 16, seed=4).to(DEVICE)
    # by default, where it measured faster: top-k alone, and top-p below 64 rows, keep the sort
    Sampler(DEVICE, 16)(logits, _meta(torch.ones(3), top_k=torch.tensor([2, 1, 1])))
    Sampler(DEVICE, 16)(logits, _meta(torch.ones(3), top_p=torch.full((3,), 0.5)))
    assert not calls
    wide = tied_logits(FUSED_TOP_P_MIN_ROWS, 16, seed=5).to(DEVICE)
    Sampler(DEVICE, 16)(wide, _meta(torch.ones(len(wide)), top_p=torch.full((len(wide),), 0.5)))
    assert len(calls) == 1
    min_p_meta = _meta(torch.ones(3))  # min-p as the only cut (no pivot search)
    min_p_meta.min_p = torch.full((3,), 0.5, device=DEVICE)
    Sampler(DEVICE, 16)(logits, min_p_meta)
    assert len(calls) == 2
    calls.clear()
    monkeypatch.setenv("COMPILED_LLM_FUSED_TOPK_SAMPLING", "0")  # never
    Sampler(DEVICE, 16)(logits, min_p_meta)
    assert not calls
    monkeypatch.setenv("COMPILED_LLM_FUSED_TOPK_SAMPLING", "1")
    sampler = Sampler(DEVICE, 16)
    out = sampler(logits, _meta(torch.tensor([0.0, 1.0, 0.8]), top_k=torch.tensor([2, 1, 1])))
    assert calls and out.sampled_token_ids.tolist() == logits.argmax(-1).tolist()
    # a seeded row keeps the general path (its own generator's noise)
    calls.clear()
    sampler(logits, _meta(torch.ones(3), top_p=torch.full((3,), 0.5),
                          generators={1: make_generator(5, DEVICE)}))
    assert not calls
    monkeypatch.setenv("COMPILED_LLM_ONE_PASS_SAMPLING", "0")
    assert not Sampler(DEVICE, 16).one_pass
