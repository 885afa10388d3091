"""Attention sinks (GPT-OSS: a learned logit per query head in every softmax, as a key of value
0) in the reference backend, through the attention op, against dense attention written out
here; the Triton kernels are checked against this reference in interpreted_cases.py."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.attention import attention
from compiled_llm.attention.forward_context import ForwardContext, set_forward_context
from tests.kernels.batches import make_batch

SCALE = 0.3
SINKS = torch.tensor([0.5, -1.0, 3.0, 8.0])  # one head's sink dominates its scores


def dense_with_sinks(batch, q_lens, ctx_lens, window: int) -> torch.Tensor:
    """Each sequence's queries over its whole context (cache rows, then this step's), causal
    with the window, each head's sink logit appended to its scores, in float32."""
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
        scores = query @ keys.transpose(1, 2) * SCALE  # [Hq, Tq, L]
        q_pos = torch.arange(ctx, total)[:, None]
        k_pos = torch.arange(total)[None, :]
        visible = (k_pos <= q_pos) & ((k_pos > q_pos - window) if window > 0 else True)
        scores = scores.masked_fill(~visible, float("-inf"))
        sink = SINKS[:, None, None].expand(-1, q_len, 1)
        probs = torch.cat([scores, sink], -1).softmax(-1)[..., :-1]
        outs.append((probs @ vals).transpose(0, 1))
        row += q_len
    return torch.cat(outs)


@pytest.mark.parametrize("window", [-1, 6])
@pytest.mark.parametrize("q_lens,ctx_lens", [([1, 1, 1], [17, 40, 2]),  # all decode
                                             ([1, 9, 1, 20], [30, 4, 5, 0])])  # mixed
def test_reference_takes_sinks_into_each_softmax(window, q_lens, ctx_lens):
    batch = make_batch(q_lens, ctx_lens, 4, 2, 32, seed=3)
    batch.kv_cache.nan_to_num_(0.0)  # free blocks hold NaN
    expected = dense_with_sinks(batch, q_lens, ctx_lens, window)
    with set_forward_context(ForwardContext(batch.meta, [batch.kv_cache], backend="torch")):
        out = attention(batch.q, batch.k, batch.v, 0, SCALE, window, True, 0.0, SINKS)
        plain = attention(batch.q, batch.k, batch.v, 0, SCALE, window)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=0)
    assert (plain - expected).abs().max() > 0.05  # the sinks change the answer here


def test_uncached_causal_takes_sinks_and_bidirectional_refuses():
    batch = make_batch([7, 12], [0, 0], 4, 2, 32, seed=4)
    with set_forward_context(ForwardContext(batch.meta, [], backend="torch")):
        out = attention(batch.q, batch.k, batch.v, 0, SCALE, -1, True, 0.0, SINKS)
        with pytest.raises(ValueError, match="attention sinks need causal"):
            attention(batch.q, batch.k, batch.v, 0, SCALE, -1, False, 0.0, SINKS)
    torch.testing.assert_close(out, dense_with_sinks(batch, [7, 12], [0, 0], -1), atol=2e-5,
                               rtol=0)
