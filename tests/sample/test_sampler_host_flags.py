"""Host-known batch flags of the sampling metadata (any_greedy) and the sampler's shortcut on
them: the same tokens as the device-side merge of greedy and random rows (CPU)."""

from __future__ import annotations

import dataclasses

import torch

from compiled_llm.core.request import Request
from compiled_llm.sample.metadata import build_sampling_metadata
from compiled_llm.sample.sampler import Sampler
from compiled_llm.sample.state import SamplingState
from compiled_llm.sampling_params import SamplingParams

V = 64


def _meta(*params: SamplingParams, neutral: frozenset[int] = frozenset()):
    reqs = [Request(str(i), [1, 2], p) for i, p in enumerate(params)]
    state = SamplingState(torch.device("cpu"), V)
    return build_sampling_metadata(reqs, state, lambda r: None, neutral)


def test_any_greedy_is_known_on_the_host():
    hot, cold = SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=0.0)
    assert _meta(hot, hot).any_greedy is False
    assert _meta(hot, cold).any_greedy is True
    assert _meta(hot, hot, neutral=frozenset({1})).any_greedy is True  # a neutral row
    mixed = _meta(hot, SamplingParams(temperature=0.5, logprobs=3, min_tokens=2, top_k=4))
    assert mixed.max_num_logprobs == 3 and mixed.max_top_k == 4 and 1 in mixed.banned_token_ids


def test_the_all_random_shortcut_draws_the_same_tokens():
    meta = _meta(SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=1.3))
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(0))
    tokens = []
    for flags in (meta, dataclasses.replace(meta, any_greedy=None)):
        torch.manual_seed(5)
        tokens.append(Sampler.sample(logits.clone(), flags).tolist())
    assert tokens[0] == tokens[1]
