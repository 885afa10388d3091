"""The sampler's device state: parameter slots and penalty rows handed out on a request's first
sampling step, grown past their first capacity, freed on release and reused; output counts
kept on the device equal the counts of the tokens sampled."""

from __future__ import annotations

import torch

from compiled_llm.core.request import Request
from compiled_llm.sample.sampler import Sampler
from compiled_llm.sample.state import TEMPERATURE, TOP_K
from compiled_llm.sampling_params import SamplingParams

V = 48


def _reqs(n: int, **kw) -> list[Request]:
    return [Request(f"r{i}", [1 + i % 5, 2, 3], SamplingParams(max_tokens=64, **kw))
            for i in range(n)]


def test_slots_grow_free_and_are_reused():
    sampler = Sampler("cpu", vocab_size=V)
    state = sampler.state
    reqs = _reqs(80, temperature=0.5, top_k=1000, frequency_penalty=0.5)  # past 64 slots, 8 rows
    meta = sampler.prepare(reqs)
    assert state.num_live == 80 and len(state.penalty_rows.of) == 80
    assert state.params.shape[0] > 80 and state.counts.shape == (state.penalty_rows.capacity + 1, V)
    assert meta.temperature.tolist() == [0.5] * 80
    assert state.params[:, TOP_K].max() == V  # top_k is cut at the vocabulary
    sampler.release([r.request_id for r in reqs[:40]])
    assert state.num_live == 40
    again = _reqs(40, temperature=0.25)
    for r in again:
        r.request_id += "'"
    sampler.prepare(again)
    assert state.num_live == 80 and max(state.slots.of.values()) <= 80  # freed slots reused
    assert state.params[state.slots.of["r0'"], TEMPERATURE] == 0.25


def test_device_counts_follow_the_sampled_tokens():
    """Over several steps the counts rows equal a recount of each request's sampled tokens
    (rows without penalties are never written)."""
    sampler = Sampler("cpu", vocab_size=V)
    reqs = _reqs(3, temperature=1.0, presence_penalty=0.1) + _reqs(2, temperature=1.0)
    for r in reqs[3:]:
        r.request_id += "-plain"
    gen = torch.Generator().manual_seed(0)
    sampled: list[list[int]] = [[] for _ in reqs]
    for _ in range(12):
        out = sampler(torch.randn(len(reqs), V, generator=gen), sampler.prepare(reqs))
        for row, token in enumerate(out.sampled_token_ids.tolist()):
            sampled[row].append(token)
    state = sampler.state
    for row, req in enumerate(reqs[:3]):
        want = torch.bincount(torch.tensor(sampled[row]), minlength=V).to(torch.int32)
        assert torch.equal(state.counts[state.penalty_rows.of[req.request_id]], want)
    assert state.counts[0].sum() == 0 and len(state.penalty_rows.of) == 3


def test_a_request_resumed_with_output_builds_its_counts_from_it():
    sampler = Sampler("cpu", vocab_size=V)
    req = Request("x", [4, 4, 9], SamplingParams(temperature=0.0, repetition_penalty=1.5),
                  output_token_ids=[7, 7, 8])
    meta = sampler.prepare([req])
    assert meta.output_counts[0, 7] == 2 and meta.output_counts[0, 8] == 1
    assert meta.prompt_mask[0].nonzero().flatten().tolist() == [4, 9]
