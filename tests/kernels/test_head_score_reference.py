"""The attention op's per-head score options in the reference backend, against dense attention
written out (batches.dense_attention): attention sinks (GPT-OSS: a learned logit per query head
in every softmax, as a key of value 0) and ALiBi (Bloom, MPT: slope_h * key position added to
each score). The Triton kernels are checked against this reference in interpreted_cases.py."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.attention import attention
from compiled_llm.attention.forward_context import ForwardContext, set_forward_context
from tests.kernels.batches import dense_attention, make_batch

SCALE = 0.3
# one head's sink dominates its scores; Bloom's slopes for 4 heads
OPTIONS = {"sinks": ("sinks", torch.tensor([0.5, -1.0, 3.0, 8.0])),
           "alibi_slopes": ("slopes", torch.tensor([0.5, 0.25, 0.125, 0.0625]))}


@pytest.mark.parametrize("option", sorted(OPTIONS))
@pytest.mark.parametrize("window", [-1, 6])
@pytest.mark.parametrize("q_lens,ctx_lens", [([1, 1, 1], [17, 40, 2]),  # all decode
                                             ([1, 9, 1, 20], [30, 4, 5, 0])])  # mixed
def test_reference_applies_the_option(option, window, q_lens, ctx_lens):
    dense_name, values = OPTIONS[option]
    batch = make_batch(q_lens, ctx_lens, 4, 2, 32, seed=3)
    batch.kv_cache.nan_to_num_(0.0)  # free blocks hold NaN
    expected = dense_attention(batch, q_lens, ctx_lens, window, SCALE, **{dense_name: values})
    with set_forward_context(ForwardContext(batch.meta, [batch.kv_cache], backend="torch")):
        out = attention(batch.q, batch.k, batch.v, 0, SCALE, window, True, 0.0,
                        **{option: values})
        plain = attention(batch.q, batch.k, batch.v, 0, SCALE, window)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=0)
    assert (plain - expected).abs().max() > 0.05  # the option changes the answer here


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_uncached_causal_takes_the_option_and_bidirectional_refuses(option):
    dense_name, values = OPTIONS[option]
    batch = make_batch([7, 12], [0, 0], 4, 2, 32, seed=4)
    with set_forward_context(ForwardContext(batch.meta, [], backend="torch")):
        out = attention(batch.q, batch.k, batch.v, 0, SCALE, -1, True, 0.0, **{option: values})
        with pytest.raises(ValueError, match="attention sinks and ALiBi need causal"):
            attention(batch.q, batch.k, batch.v, 0, SCALE, -1, False, 0.0, **{option: values})
    expected = dense_attention(batch, [7, 12], [0, 0], -1, SCALE, **{dense_name: values})
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=0)
