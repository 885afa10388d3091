"""The proposer registry, n-gram prompt lookup (host, and the device formulation against it on
many random histories) and which requests may take drafts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compiled_llm.core.request import Request
from compiled_llm.core.scheduler import SchedulerOutput
from compiled_llm.sample.spec_decode.ngram_device import DeviceNgramProposer, ngram_propose_batch
from compiled_llm.sample.spec_decode.proposers import (
    PROPOSERS,
    NgramProposer,
    make_proposer,
    ngram_propose,
    spec_eligible,
)
from compiled_llm.sampling_params import SamplingParams
from compiled_llm.speculative import SpeculativeConfig


def _ids(*tokens):
    return np.asarray(tokens, dtype=np.int64)


def test_ngram_takes_the_longest_latest_match():
    # suffix (3, 4) occurs twice; the latest occurrence is followed by 9, 9
    assert ngram_propose(_ids(3, 4, 5, 6, 3, 4, 9, 9, 3, 4), 1, 3, 2) == [9, 9]
    # the 3-gram (1, 3, 4) beats the 2-gram (3, 4): its continuation wins
    assert ngram_propose(_ids(1, 3, 4, 7, 8, 2, 3, 4, 5, 1, 3, 4), 2, 3, 3) == [7, 8, 2]
    assert ngram_propose(_ids(1, 2, 3, 4), 1, 3, 2) == []  # nothing repeats
    assert ngram_propose(_ids(5, 6, 5), 1, 2, 4) == [6, 5]  # fewer near the end
    assert ngram_propose(_ids(5, 6, 5, 6), 3, 3, 2) == []  # below prompt_lookup_min


def test_registry_builds_by_method():
    import compiled_llm.worker.draft_model  # noqa: F401  (registers itself)

    assert {"ngram", "draft_model"} <= set(PROPOSERS)
    cfg = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 2,
                                       "prompt_lookup_min": 1, "prompt_lookup_max": 2})
    proposer = make_proposer(cfg)
    assert isinstance(proposer, NgramProposer)
    req = Request("r", [4, 5, 6, 4, 5], SamplingParams(max_tokens=8))
    drafts = proposer.propose(SchedulerOutput([(req, 1)]), {"r": [6]})
    assert drafts == {"r": [4, 5]}  # after ... 5, 6: the earlier "5 6" was followed by 4, 5
    assert proposer.draft_probs("r", 2) is None  # deterministic drafts: q is one-hot


@pytest.mark.parametrize("params, ok", [
    (dict(), True),
    (dict(temperature=0.7, top_k=5, top_p=0.9, seed=3, logit_bias={1: 2.0}), True),
    (dict(logprobs=2), False),
    (dict(presence_penalty=0.5), False),
    (dict(repetition_penalty=1.2), False),
    (dict(min_tokens=4), False),
])
def test_eligibility(params, ok):
    assert spec_eligible(Request("r", [1, 2], SamplingParams(**params))) is ok


def _windowed_lookup(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> list[int]:
    """The lookup by its definition: every window of every size, the longest size first."""
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)
        hits = np.flatnonzero((windows == tokens[len(tokens) - n:]).all(axis=1))
        if len(hits):
            return tokens[hits[-1] + n:hits[-1] + n + k].tolist()
    return []


def _random_histories(rng, num: int) -> list[np.ndarray]:
    # small vocabularies so that suffixes repeat, lengths from 1 token on
    return [rng.integers(0, int(rng.integers(2, 6)), size=int(rng.integers(1, 40)))
            for _ in range(num)]


def test_host_lookup_matches_its_definition():
    rng = np.random.default_rng(0)
    for tokens in _random_histories(rng, 1500):
        low = int(rng.integers(1, 4))
        high, k = int(rng.integers(low, 6)), int(rng.integers(1, 5))
        assert ngram_propose(tokens, low, high, k) == _windowed_lookup(tokens, low, high, k)


_DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")])]


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("low, high, k", [(1, 1, 1), (1, 3, 4), (2, 4, 3), (3, 5, 2)])
def test_device_lookup_matches_the_host_lookup(low, high, k, device):
    rng = np.random.default_rng(low * 10 + high)
    histories = _random_histories(rng, 500)
    width = max(len(h) for h in histories) + 3  # columns past a row's length hold noise
    padded = torch.from_numpy(rng.integers(0, 6, size=(len(histories), width)))
    for i, tokens in enumerate(histories):
        padded[i, :len(tokens)] = torch.from_numpy(tokens)
    lengths = torch.tensor([len(h) for h in histories])
    drafts, counts = (t.cpu() for t in ngram_propose_batch(padded.to(device),
                                                           lengths.to(device), low, high, k))
    for i, tokens in enumerate(histories):
        want = ngram_propose(tokens, low, high, k)
        assert drafts[i, :counts[i]].tolist() == want
        assert (drafts[i, counts[i]:] == -1).all()


def test_device_proposer_follows_the_host_one_over_steps():
    """Requests grow, join and leave (rows freed and reused); both proposers agree."""
    cfg = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3,
                                       "prompt_lookup_min": 1, "prompt_lookup_max": 3})
    host = NgramProposer(cfg)
    device = DeviceNgramProposer(cfg, torch.device("cpu"), max_num_seqs=4, max_len=400)
    rng = np.random.default_rng(7)
    live: list[Request] = []
    for step in range(60):
        if len(live) < 4 and rng.random() < 0.5:
            prompt = rng.integers(0, 4, size=int(rng.integers(1, 30))).tolist()
            live.append(Request(f"r{step}", prompt, SamplingParams(max_tokens=400)))
        scheduled = [r for r in live if rng.random() < 0.8]
        sampled = {r.request_id: rng.integers(0, 4, size=int(rng.integers(1, 4))).tolist()
                   for r in scheduled}
        sched = SchedulerOutput([(r, 1) for r in scheduled])
        assert device.propose(sched, sampled) == host.propose(sched, sampled)
        for r in scheduled:
            for token in sampled[r.request_id]:
                r.append_token(token)
        if live and rng.random() < 0.2:
            live.pop(int(rng.integers(len(live))))
    assert len(device.history.free) + len(device.history.slots) == 4
