"""Soft-capped attention scores (Gemma 2's attn_logit_softcapping) in the reference backend,
through the attention op, against dense attention written out here; the Triton kernels are
checked against this reference in interpreted_cases.py."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.attention import attention
from compiled_llm.attention.forward_context import ForwardContext, set_forward_context
from tests.kernels.batches import make_batch

SCALE, CAP = 0.3, 2.0


def dense_softcapped(batch, q_lens, ctx_lens, window: int) -> torch.Tensor:
    """Each sequence's queries over its whole context (cache rows, then this step's), scores
    capped as cap * tanh(score / cap), causal with the window, in float32."""
    meta, outs, row = batch.meta, [], 0
    block_size = batch.kv_cache.shape[2]
    for index, (q_len, ctx) in enumerate(zip(q_lens, ctx_lens)):
        total = ctx + q_len
        blocks = meta.block_tables[index, : -(-total // block_size)].long()
        keys = batch.kv_cache[0][blocks].flatten(0, 1)[:ctx].clone()  # [ctx, Hkv, D]
        vals = batch.kv_cache[1][blocks].flatten(0, 1)[:ctx].clone()
        keys = torch.cat([keys, batch.k[row:row + q_len]]).transpose(0, 1)  # [Hkv, L, D]
        vals = torch.cat([vals, batch.v[row:row + q_len]]).transpose(0, 1)
        query = batch.q[row:row + q_len].transpose(0, 1)  # [Hq, Tq, D]
        group = query.shape[0] // keys.shape[0]
        keys, vals = keys.repeat_interleave(group, 0), vals.repeat_interleave(group, 0)
        scores = CAP * torch.tanh(query @ keys.transpose(1, 2) * SCALE / CAP)
        q_pos = torch.arange(ctx, total)[:, None]
        k_pos = torch.arange(total)[None, :]
        visible = (k_pos <= q_pos) & ((k_pos > q_pos - window) if window > 0 else True)
        scores = scores.masked_fill(~visible, float("-inf"))
        outs.append((scores.softmax(-1) @ vals).transpose(0, 1))
        row += q_len
    return torch.cat(outs)


@pytest.mark.parametrize("window", [-1, 6])
@pytest.mark.parametrize("q_lens,ctx_lens", [([1, 1, 1], [17, 40, 2]),  # all decode
                                             ([1, 9, 1, 20], [30, 4, 5, 0])])  # mixed
def test_reference_soft_caps_scores(window, q_lens, ctx_lens):
    batch = make_batch(q_lens, ctx_lens, 4, 2, 32, seed=3)
    batch.kv_cache.nan_to_num_(0.0)  # free blocks hold NaN: the uncapped SDPA would see them
    expected = dense_softcapped(batch, q_lens, ctx_lens, window)
    with set_forward_context(ForwardContext(batch.meta, [batch.kv_cache], backend="torch")):
        out = attention(batch.q, batch.k, batch.v, 0, SCALE, window, True, CAP)
        uncapped = attention(batch.q, batch.k, batch.v, 0, SCALE, window)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=0)
    assert (uncapped - expected).abs().max() > 0.05  # the cap changes the answer here


def test_uncached_causal_soft_caps_and_bidirectional_refuses():
    batch = make_batch([7, 12], [0, 0], 4, 2, 32, seed=4)
    with set_forward_context(ForwardContext(batch.meta, [], backend="torch")):
        out = attention(batch.q, batch.k, batch.v, 0, SCALE, -1, True, CAP)
        with pytest.raises(ValueError, match="soft-capped scores and attention sinks need causal"):
            attention(batch.q, batch.k, batch.v, 0, SCALE, -1, False, CAP)
    torch.testing.assert_close(out, dense_softcapped(batch, [7, 12], [0, 0], -1), atol=2e-5,
                               rtol=0)
