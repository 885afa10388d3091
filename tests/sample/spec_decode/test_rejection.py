"""The verifier keeps the target's distribution: statistical checks (total variation over many
draws) for one-hot drafts (n-gram) and drawn drafts (a draft model), greedy acceptance, and
seeded requests drawing the same tokens again."""

from __future__ import annotations

import torch

from compiled_llm.core.request import Request
from compiled_llm.sample.sampler import Sampler
from compiled_llm.sample.spec_decode.rejection import VerifyBatch, verify
from compiled_llm.sampling_params import SamplingParams

V, K, N = 6, 2, 20000
PARAMS = SamplingParams(temperature=0.8, top_k=4, max_tokens=8)


def _target(logits: torch.Tensor) -> torch.Tensor:
    """The sampler's distribution for PARAMS, by hand: temperature, then top-k."""
    scaled = logits / PARAMS.temperature
    kth = scaled.topk(PARAMS.top_k, dim=-1).values[:, -1:]
    return torch.softmax(scaled.masked_fill(scaled < kth, float("-inf")), dim=-1)


def _run(drafts, probs, params=PARAMS, seed_logits=0):
    torch.manual_seed(seed_logits)
    row_logits = torch.randn(K + 1, V) * 1.5
    req = Request("r", [1], params)
    sampler = Sampler("cpu", V)
    logits = row_logits.repeat(len(drafts), 1)
    meta = sampler.prepare([req] * len(logits))
    return verify(logits, meta, VerifyBatch.of(drafts, probs)), _target(row_logits)


def _tv(samples: torch.Tensor, dist: torch.Tensor) -> float:
    freq = torch.bincount(samples, minlength=V).double() / len(samples)
    return 0.5 * float((freq - dist.double()).abs().sum())


def _check(out, target, drafts):
    first = torch.tensor([tokens[0] for tokens in out])
    assert _tv(first, target[0]) < 0.02
    # given the first draft accepted, the next token follows the target's second row
    second = torch.tensor([tokens[1] for tokens, d in zip(out, drafts)
                           if tokens[0] == d[0] and len(tokens) > 1])
    assert len(second) > N // 20
    assert _tv(second, target[1]) < 0.04
    return first


def test_one_hot_drafts_keep_the_target_distribution():
    _, target = _run([[0, 0]], [None])
    guess = [int(row.argsort(descending=True)[1]) for row in target[:K]]  # likely, not best
    drafts = [guess] * N  # n-gram drafts: the same tokens every time, q one-hot
    out, target = _run(drafts, [None] * N)
    first = _check(out, target, drafts)
    assert _tv(first, torch.nn.functional.one_hot(torch.tensor(guess[0]), V).float()) > 0.3


def test_drawn_drafts_keep_the_target_distribution():
    gen = torch.Generator().manual_seed(5)
    q = torch.softmax(torch.randn(K, V, generator=gen) * 2, dim=-1)  # a poor draft model
    drafts = torch.multinomial(q, N, replacement=True, generator=gen).T.tolist()
    out, target = _run(drafts, [q] * N)
    first = _check(out, target, drafts)
    assert _tv(first, q[0]) > 0.05  # the draft's own distribution is measurably different
    accepted = sum(len(tokens) - 1 for tokens in out) / (N * K)
    assert 0.05 < accepted < 0.95


def test_greedy_accepts_the_argmax_prefix():
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    torch.manual_seed(0)
    best = (torch.randn(K + 1, V) * 1.5).argmax(dim=-1).tolist()
    out, _ = _run([[best[0], best[1]], [best[0], (best[1] + 1) % V], [(best[0] + 1) % V, 0]],
                  [None] * 3, greedy)
    assert out == [best, best[:2], best[:1]]


def test_seeded_requests_repeat():
    seeded = SamplingParams(temperature=1.0, seed=11, max_tokens=8)
    first, _ = _run([[1, 2]] * 50, [None] * 50, seeded)
    again, _ = _run([[1, 2]] * 50, [None] * 50, seeded)
    assert first == again
