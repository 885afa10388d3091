"""The sampler's step never makes the host wait for the device: what it sends is built on the
host and copied with non_blocking=True (pinned on CUDA), and nothing reads a device tensor.
Checked on CPU by watching the calls that would block on CUDA (tests.utils.HostSyncWatch)."""

from __future__ import annotations

import torch

from compiled_llm.core.request import Request
from compiled_llm.sample.sampler import Sampler, apply_top_k_top_p
from compiled_llm.sampling_params import SamplingParams
from tests.utils import HostSyncWatch

V = 64
FEATURES = [
    dict(temperature=0.0),
    dict(temperature=0.7),
    dict(temperature=1.0, top_k=5, top_p=0.9, min_p=0.05, seed=3),
    dict(temperature=1.2, presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.2),
    dict(temperature=0.0, repetition_penalty=1.5, logprobs=3),
    dict(temperature=1.0, logit_bias={3: 2.0, 4: -1.0}, seed=9),
    dict(temperature=1.0, allowed_token_ids=[1, 2, 5, 8]),
    dict(temperature=0.0, min_tokens=4, stop_token_ids=[6]),
]


def test_the_watch_sees_blocking_copies_and_reads():
    with HostSyncWatch() as watch:
        t = torch.tensor([1.0], device="cpu")  # blocking on CUDA
        t.to("cpu")
        t.to("cpu", non_blocking=True)  # fine
        t.to(torch.float64)  # a dtype change moves nothing: fine
        float(t.sum())
        t.tolist()
    assert watch.calls == ["tensor", "to", "__float__", "tolist"]


def test_sampler_steps_copy_without_blocking_and_read_nothing():
    sampler = Sampler("cpu", vocab_size=V)
    reqs = [Request(str(i), [1, 2, 3 + i], SamplingParams(max_tokens=32, **kw), eos_token_ids=(0,))
            for i, kw in enumerate(FEATURES)]
    logits = torch.randn(len(reqs), V, generator=torch.Generator().manual_seed(0))
    with HostSyncWatch() as watch:
        for _ in range(4):  # the first step writes the slots and counts, later ones reuse them
            meta = sampler.prepare(reqs)
            sampler(logits, meta)
            for req in reqs:
                req.num_pending += 1  # as the async scheduler counts a launched token
    assert watch.calls == [] and not meta.row_errors
    assert meta.top_k is not None and meta.output_counts is not None and meta.banned_token_ids


def test_top_k_without_a_host_bound_reads_nothing():
    logits = torch.randn(4, V)
    with HostSyncWatch() as watch:
        apply_top_k_top_p(logits, torch.tensor([1, 2, 0, 9]), None)  # max_top_k unknown
    assert watch.calls == []
    assert torch.isfinite(logits[0]).sum() == 1 and torch.isfinite(logits[2]).all()
