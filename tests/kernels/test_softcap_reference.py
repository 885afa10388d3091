"""Soft-capped attention scores (Gemma 2's attn_logit_softcapping) in the reference backend,
through the attention op, against dense attention written out (batches.dense_attention); the
Triton kernels are checked against this reference in interpreted_cases.py."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.attention import attention
from compiled_llm.attention.forward_context import ForwardContext, set_forward_context
from tests.kernels.batches import dense_attention, make_batch

SCALE, CAP = 0.3, 2.0


@pytest.mark.parametrize("window", [-1, 6])
@pytest.mark.parametrize("q_lens,ctx_lens", [([1, 1, 1], [17, 40, 2]),  # all decode
                                             ([1, 9, 1, 20], [30, 4, 5, 0])])  # mixed
def test_reference_soft_caps_scores(window, q_lens, ctx_lens):
    batch = make_batch(q_lens, ctx_lens, 4, 2, 32, seed=3)
    batch.kv_cache.nan_to_num_(0.0)  # free blocks hold NaN: the uncapped SDPA would see them
    expected = dense_attention(batch, q_lens, ctx_lens, window, SCALE, CAP)
    with set_forward_context(ForwardContext(batch.meta, [batch.kv_cache], backend="torch")):
        out = attention(batch.q, batch.k, batch.v, 0, SCALE, window, True, CAP)
        uncapped = attention(batch.q, batch.k, batch.v, 0, SCALE, window)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=0)
    assert (uncapped - expected).abs().max() > 0.05  # the cap changes the answer here


def test_uncached_causal_soft_caps_and_bidirectional_refuses():
    batch = make_batch([7, 12], [0, 0], 4, 2, 32, seed=4)
    with set_forward_context(ForwardContext(batch.meta, [], backend="torch")):
        out = attention(batch.q, batch.k, batch.v, 0, SCALE, -1, True, CAP)
        with pytest.raises(ValueError, match="soft-capped scores, attention sinks and ALiBi"):
            attention(batch.q, batch.k, batch.v, 0, SCALE, -1, False, CAP)
    expected = dense_attention(batch, [7, 12], [0, 0], -1, SCALE, CAP)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=0)
