"""The one-launch decode (QK-norm + RoPE + KV write inside split decode attention) against the two
kernels it replaces (the fused write, then split decode), run by test_interpreter.py with
TRITON_INTERPRET=1: equal caches and outputs within float32 rounding (the newest key is folded
in last) with and without norms, GQA groups, splits merged by the reduce kernel or one direct
split, padded sequences, a sliding window, bf16; FP8 caches refused; and the
qk_norm_rope_attention op on the triton backend against the reference."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from compiled_llm.attention.kernels import DecodeConfig, decode_attention, kernels_interpreted
from compiled_llm.attention.kernels.decode_qk import decode_qk_norm_rope_attention
from compiled_llm.attention.kernels.qk_norm_rope import qk_norm_rope_kv_write
from tests.kernels.batches import make_batch, pad_decode
from tests.kernels.qk_norm_rope_interpreted_cases import rope_tables

pytestmark = pytest.mark.skipif(not kernels_interpreted(), reason="needs TRITON_INTERPRET=1")
CONFIG = DecodeConfig(block_n=16, num_warps=4, num_stages=2)


def _decode_inputs(ctx_lens, heads=(4, 2), norms=True, pads=0, dtype=torch.float32, seed=0):
    batch = make_batch([1] * len(ctx_lens), ctx_lens, heads[0], heads[1], 32, dtype=dtype,
                       seed=seed)
    batch = pad_decode(batch, pads) if pads else batch
    batch.kv_cache.nan_to_num_(0.0)
    cos, sin = rope_tables(batch.q.shape[0], 32, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    weights = (1 + 0.2 * torch.randn(2, 32, generator=gen)).to(dtype) if norms else (None, None)
    return batch, cos, sin, weights[0], weights[1]


def _both(batch, cos, sin, q_w, k_w, window=0, splits=None, config=CONFIG):
    """(two-kernel output, its cache, one-launch output, its cache) from the same cache."""
    meta, two_cache, one_cache = batch.meta, batch.kv_cache.clone(), batch.kv_cache.clone()
    q_rot, _ = qk_norm_rope_kv_write(batch.q, batch.k, batch.v, cos, sin, q_w, k_w, 1e-6,
                                     two_cache, meta, None)
    two = decode_attention(q_rot, two_cache, meta.seq_lens, meta.block_tables, 0.2, window,
                           torch.zeros_like(q_rot), config, splits)
    one = decode_qk_norm_rope_attention(
        batch.q, batch.k, batch.v, cos, sin, q_w, k_w, 1e-6, one_cache, meta.seq_lens,
        meta.block_tables, meta.slot_mapping, 0.2, window, torch.zeros_like(q_rot), config,
        splits)
    return two, two_cache, one, one_cache


@pytest.mark.parametrize("norms", [True, False])
@pytest.mark.parametrize("splits", [None, 1, 3])
def test_one_launch_equals_two_kernels(norms, splits):
    batch, cos, sin, q_w, k_w = _decode_inputs([17, 0, 40, 5], norms=norms, pads=2)
    two, two_cache, one, one_cache = _both(batch, cos, sin, q_w, k_w, splits=splits)
    assert torch.equal(one_cache, two_cache)
    torch.testing.assert_close(one, two, rtol=1e-5, atol=1e-6)
    assert one.abs().sum() > 0 and not one[4:].any()  # padded sequences: zeros


@pytest.mark.parametrize("splits", [1, 2])
def test_launch_order_changes_no_output_or_cache(splits):
    # longest context first: every sequence's newest key still written once, outputs bit for
    # bit the grid order's
    batch, cos, sin, q_w, k_w = _decode_inputs([17, 0, 40, 5], pads=1, seed=4)
    caches = batch.kv_cache.clone(), batch.kv_cache.clone()
    outs = [decode_qk_norm_rope_attention(
        batch.q, batch.k, batch.v, cos, sin, q_w, k_w, 1e-6, cache, batch.meta.seq_lens,
        batch.meta.block_tables, batch.meta.slot_mapping, 0.2, 0, torch.zeros_like(batch.q),
        CONFIG, splits, order) for cache, order in
        zip(caches, (None, torch.tensor([2, 0, 3, 1, 4], dtype=torch.int32)))]
    assert torch.equal(outs[0], outs[1]) and torch.equal(caches[0], caches[1])
    assert outs[0].abs().sum() > 0


@pytest.mark.parametrize("in_launch", [False, True])
def test_split_keys_and_in_launch_merge(in_launch):
    # a split per 16 keys of 8 (18 keys: 2 used, 1: 1, 41: 3 with the newest in the third);
    # the merge by the last split or by the reduce kernel
    config = replace(CONFIG, split_keys=16, merge_in_launch=in_launch)
    batch, cos, sin, q_w, k_w = _decode_inputs([17, 0, 40, 5], pads=1, seed=8)
    two, two_cache, one, one_cache = _both(batch, cos, sin, q_w, k_w, splits=8, config=config)
    assert torch.equal(one_cache, two_cache)
    torch.testing.assert_close(one, two, rtol=1e-5, atol=1e-6)
    assert one.abs().sum() > 0 and not one[4:].any()


@pytest.mark.parametrize("heads", [(6, 2), (2, 2), (8, 1)])
def test_groups_and_window(heads):
    batch, cos, sin, q_w, k_w = _decode_inputs([33, 9], heads=heads, seed=2)
    two, two_cache, one, one_cache = _both(batch, cos, sin, q_w, k_w, window=12, splits=2)
    assert torch.equal(one_cache, two_cache)
    torch.testing.assert_close(one, two, rtol=1e-5, atol=1e-6)


def test_bf16_and_one_sided_norm():
    batch, cos, sin, q_w, _ = _decode_inputs([20, 3, 64], dtype=torch.bfloat16, seed=4)
    two, two_cache, one, one_cache = _both(batch, cos, sin, q_w, None)
    assert torch.equal(one_cache, two_cache)
    torch.testing.assert_close(one, two, rtol=2e-2, atol=2e-3)
    assert (one != two).float().mean() < 0.02  # a rare bf16 rounding flip


def test_refuses_an_fp8_cache():
    batch, cos, sin, q_w, k_w = _decode_inputs([9, 26], seed=6)
    meta = batch.meta
    with pytest.raises(ValueError, match="cache of q's dtype"):
        decode_qk_norm_rope_attention(
            batch.q, batch.k, batch.v, cos, sin, q_w, k_w, 1e-6,
            batch.kv_cache.to(torch.float8_e4m3fn), meta.seq_lens, meta.block_tables,
            meta.slot_mapping, 0.2, 0, torch.zeros_like(batch.q), CONFIG)


def test_the_op_on_the_triton_backend_matches_the_reference():
    from compiled_llm.attention import attention, qk_norm_rope_attention
    from compiled_llm.attention.forward_context import ForwardContext, set_forward_context
    from compiled_llm.attention.qk_norm_rope import qk_norm_rope_ref

    for q_lens, ctx_lens in (([1, 1, 1], [12, 0, 30]), ([1, 4, 1], [7, 0, 3])):
        batch = make_batch(q_lens, ctx_lens, 4, 2, 32, seed=5)
        batch.kv_cache.nan_to_num_(0.0)
        cos, sin = rope_tables(batch.q.shape[0], 32, 5)
        q_w, k_w = 1 + 0.2 * torch.randn(2, 32, generator=torch.Generator().manual_seed(9))
        ref_cache = batch.kv_cache.clone()
        q, k = qk_norm_rope_ref(batch.q, batch.k, cos, sin, q_w, k_w, 1e-6)
        with set_forward_context(ForwardContext(batch.meta, [ref_cache], backend="torch")):
            ref = attention(q, k, batch.v, 0, 0.2, -1)
        with set_forward_context(ForwardContext(batch.meta, [batch.kv_cache], backend="triton")):
            out = qk_norm_rope_attention(batch.q, batch.k, batch.v, cos, sin, q_w, k_w, 1e-6, 0,
                                         0.2, -1)
        torch.testing.assert_close(batch.kv_cache, ref_cache, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("window", [-1, 6])
def test_soft_capped_one_launch_matches_the_reference_op(window):
    # Gemma 2's capped scores in the one launch (the newest key's score capped as the tiles'),
    # against the two-op reference through the op
    from compiled_llm.attention import attention, qk_norm_rope_attention
    from compiled_llm.attention.forward_context import ForwardContext, set_forward_context
    from compiled_llm.attention.qk_norm_rope import qk_norm_rope_ref

    batch, cos, sin, _, _ = _decode_inputs([17, 0, 40, 5], norms=False, pads=1, seed=4)
    batch.q.mul_(4.0)  # scores well past the cap
    ref_cache = batch.kv_cache.clone()
    q, k = qk_norm_rope_ref(batch.q, batch.k, cos, sin, None, None, 1e-6)
    with set_forward_context(ForwardContext(batch.meta, [ref_cache], backend="torch")):
        ref = attention(q, k, batch.v, 0, 0.2, window, True, 2.0)
        uncapped = attention(q, k, batch.v, 0, 0.2, window)
    with set_forward_context(ForwardContext(batch.meta, [batch.kv_cache], backend="triton")):
        out = qk_norm_rope_attention(batch.q, batch.k, batch.v, cos, sin, None, None, 1e-6, 0,
                                     0.2, window, True, 2.0)
    rows = 4  # the padded sequence (no keys) is the reference's NaN, the kernel's zeros
    torch.testing.assert_close(out[:rows], ref[:rows], rtol=1e-4, atol=1e-4)
    assert (uncapped[:rows] - ref[:rows]).abs().max() > 0.05


@pytest.mark.parametrize("option", ["sinks", "alibi_slopes"])
def test_head_score_options_one_launch_match_the_reference_op(option):
    # GPT-OSS's sink logits (split 0 starts from them) and ALiBi's slopes (the newest key, at
    # the query's position, has no bias) in the one launch, against the two-op reference
    from compiled_llm.attention import attention, qk_norm_rope_attention
    from compiled_llm.attention.forward_context import ForwardContext, set_forward_context
    from compiled_llm.attention.qk_norm_rope import qk_norm_rope_ref

    batch, cos, sin, _, _ = _decode_inputs([17, 0, 40, 5], norms=False, pads=1, seed=5)
    heads = batch.q.shape[1]
    values = torch.linspace(-2.0, 6.0, heads) if option == "sinks" else \
        2.0 ** -torch.arange(1.0, heads + 1)
    extra = {option: values}
    ref_cache = batch.kv_cache.clone()
    q, k = qk_norm_rope_ref(batch.q, batch.k, cos, sin, None, None, 1e-6)
    with set_forward_context(ForwardContext(batch.meta, [ref_cache], backend="torch")):
        ref = attention(q, k, batch.v, 0, 0.2, -1, True, 0.0, **extra)
        plain = attention(q, k, batch.v, 0, 0.2, -1)
    with set_forward_context(ForwardContext(batch.meta, [batch.kv_cache], backend="triton")):
        out = qk_norm_rope_attention(batch.q, batch.k, batch.v, cos, sin, None, None, 1e-6, 0,
                                     0.2, -1, True, 0.0, **extra)
    rows = 4  # the padded sequence (no keys) is the reference's NaN, the kernel's zeros
    torch.testing.assert_close(out[:rows], ref[:rows], rtol=1e-4, atol=1e-4)
    assert (plain[:rows] - ref[:rows]).abs().max() > 0.05
