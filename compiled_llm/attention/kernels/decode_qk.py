"""Split decode attention that starts from the qkv GEMM's output: each program norms and rotates
its query heads itself; the program whose split holds the newest key reads the cached keys
before it, attends the newest from registers and writes it into the paged cache (no wait on
its own store). One launch does what the fused QK-norm + RoPE + KV write kernel and the split
decode kernel do in two; the merge is decode.py's. Caches of q's dtype (FP8: the two)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from compiled_llm.attention.kernels.decode import (
    LOG2E,
    DecodeConfig,
    attend_keys,
    group_pad,
    merge_splits,
    plan_splits,
    program_split,
    store_split,
)
from compiled_llm.attention.kernels.qk_norm_rope import norm_rope, store_rows
from compiled_llm.attention.kernels.tile import soft_tanh
from compiled_llm.gemm.pdl import dependency_sync


@triton.jit
def _rope_rows(cos_ptr, sin_ptr, b, stride_cos, stride_sin, dtype: tl.constexpr,
               D: tl.constexpr):
    """Token b's cos/sin halves [1, D/2], cast to the heads' dtype first as the models do."""
    half = tl.arange(0, D // 2)
    cos_row = cos_ptr + b.to(tl.int64) * stride_cos
    sin_row = sin_ptr + b.to(tl.int64) * stride_sin
    cos1 = tl.load(cos_row + half).to(dtype).to(tl.float32)[None, :]
    cos2 = tl.load(cos_row + D // 2 + half).to(dtype).to(tl.float32)[None, :]
    sin1 = tl.load(sin_row + half).to(dtype).to(tl.float32)[None, :]
    sin2 = tl.load(sin_row + D // 2 + half).to(dtype).to(tl.float32)[None, :]
    return cos1, sin1, cos2, sin2


@triton.jit
def _attend_newest(acc, l_i, m_i, q1, q2, k1, k2, v, qk_scale, SOFTCAP: tl.constexpr = 0.0):
    """One more online-softmax step over the newest key, held in registers: q halves [G_PAD,
    D/2] and k halves [1, D/2] as the dtype rounds them, v [1, D]; p rounded as the tiles'
    P @ V rounds it; the score soft-capped as attend_tile caps it."""
    score = (tl.sum(q1.to(tl.float32) * k1.to(tl.float32), 1)
             + tl.sum(q2.to(tl.float32) * k2.to(tl.float32), 1)) * qk_scale  # [G_PAD]
    if SOFTCAP > 0:
        score = SOFTCAP * soft_tanh(score / SOFTCAP)
    m_new = tl.maximum(m_i, score)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(score - m_new)
    p_v = p.to(v.dtype).to(tl.float32)[:, None] * v.to(tl.float32)
    return acc * alpha[:, None] + p_v, l_i * alpha + p, m_new


@triton.jit
def _query_halves(q_row, stride_qh, kvh, qw_ptr, cos1, sin1, cos2, sin2, eps,
                  G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr,
                  HAS_Q_NORM: tl.constexpr):
    """KV head kvh's G query heads normed and rotated, halves [G_PAD, D/2] in q's dtype
    (rows past G zero)."""
    offs_g = tl.arange(0, G_PAD)
    g_ok = (offs_g < G)[:, None]
    q1, q2 = norm_rope(q_row, stride_qh, kvh * G + offs_g, g_ok, qw_ptr, cos1, sin1, cos2,
                       sin2, eps, D, HAS_Q_NORM)
    dtype = q_row.dtype.element_ty
    return tl.where(g_ok, q1, 0.0).to(dtype), tl.where(g_ok, q2, 0.0).to(dtype)


@triton.jit
def _newest_key(acc, l_i, m_i, q1, q2, b, kvh, k_ptr, v_ptr, kw_ptr, slot_ptr, cos1, sin1,
                cos2, sin2, eps, qk_scale, k_cache_ptr, v_cache_ptr, seq_lens_ptr, stride_kt,
                stride_kh, stride_vt, stride_vh, stride_cb, stride_cs, stride_ch,
                HKV: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                HAS_K_NORM: tl.constexpr, SOFTCAP: tl.constexpr = 0.0):
    """The newest key (normed, rotated) and value from registers: attended, and stored at
    slot_ptr[b] (negative: not stored) without waiting on the store."""
    heads = kvh + tl.arange(0, 1)
    ones = (heads >= 0)[:, None]
    k1, k2 = norm_rope(k_ptr + b.to(tl.int64) * stride_kt, stride_kh, heads, ones, kw_ptr,
                       cos1, sin1, cos2, sin2, eps, D, HAS_K_NORM)
    k1, k2 = k1.to(q1.dtype), k2.to(q1.dtype)
    v = tl.load(v_ptr + b.to(tl.int64) * stride_vt + kvh * stride_vh
                + tl.arange(0, D)[None, :])  # [1, D]
    acc, l_i, m_i = _attend_newest(acc, l_i, m_i, q1, q2, k1, k2, v, qk_scale, SOFTCAP)
    slot = tl.load(slot_ptr + b).to(tl.int64)
    if slot >= 0:
        store_rows(k1, k2, v, heads, ones, slot, k_cache_ptr, v_cache_ptr, seq_lens_ptr, 0.0,
                   stride_cb, stride_cs, stride_ch, HKV, D, BS, False)
    return acc, l_i, m_i


@triton.jit
def _decode_qk_split_kernel(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, eps, slot_ptr,
    k_cache_ptr, v_cache_ptr, table_ptr, seq_lens_ptr, order_ptr, out_ptr, part_acc_ptr,
    part_ml_ptr, counter_ptr, sinks_ptr, slopes_ptr, qk_scale, window, num_splits,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_cos, stride_sin,
    stride_ot, stride_oh, stride_cb, stride_cs, stride_ch, stride_tb,
    G: tl.constexpr, G_PAD: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
    BS: tl.constexpr, HKV: tl.constexpr, HAS_WINDOW: tl.constexpr, DIRECT: tl.constexpr,
    PREC: tl.constexpr, HAS_Q_NORM: tl.constexpr, HAS_K_NORM: tl.constexpr,
    MERGE: tl.constexpr = False, S_PAD: tl.constexpr = 1, SPLIT_KEYS: tl.constexpr = 0,
    PDL: tl.constexpr = 0, ORDER: tl.constexpr = False, SOFTCAP: tl.constexpr = 0.0,
    SINKS: tl.constexpr = False, ALIBI: tl.constexpr = False,
):
    """Program (seq b, KV head, split): q heads from raw q (normed, rotated, rounded to the
    dtype as the fused write kernel stores them), the split's cached keys, and in the split
    holding the newest key that key and value from registers, also stored at slot_ptr[b].
    Splits past those the context uses do nothing. ORDER: see decode.program_seq."""
    dependency_sync(PDL)
    b, kvh, split, seq_len, start, end, used = program_split(
        seq_lens_ptr, order_ptr, num_splits, window, BLOCK_N, HAS_WINDOW, SPLIT_KEYS, ORDER)
    if split < used:
        newest = (start < end) & (end == seq_len)
        cos1, sin1, cos2, sin2 = _rope_rows(cos_ptr, sin_ptr, b, stride_cos, stride_sin,
                                            q_ptr.dtype.element_ty, D)
        q1, q2 = _query_halves(q_ptr + b.to(tl.int64) * stride_qt, stride_qh, kvh, qw_ptr,
                               cos1, sin1, cos2, sin2, eps, G, G_PAD, D, HAS_Q_NORM)
        q = tl.reshape(tl.permute(tl.join(q1, q2), (0, 2, 1)), (G_PAD, D))  # [G_PAD, D]
        acc, l_i, m_i = attend_keys(q, b, kvh, seq_len, start, end - newest.to(tl.int32),
                                    k_cache_ptr, v_cache_ptr, table_ptr, seq_lens_ptr,
                                    qk_scale, window, stride_cb, stride_cs, stride_ch,
                                    stride_tb, sinks_ptr, slopes_ptr, split, G, G_PAD, BLOCK_N,
                                    D, BS, PREC, False, SOFTCAP, SINKS, ALIBI)
        if newest:
            acc, l_i, m_i = _newest_key(acc, l_i, m_i, q1, q2, b, kvh, k_ptr, v_ptr, kw_ptr,
                                        slot_ptr, cos1, sin1, cos2, sin2, eps, qk_scale,
                                        k_cache_ptr, v_cache_ptr, seq_lens_ptr, stride_kt,
                                        stride_kh, stride_vt, stride_vh, stride_cb, stride_cs,
                                        stride_ch, HKV, D, BS, HAS_K_NORM, SOFTCAP)
        store_split(acc, l_i, m_i, b, kvh, split, used, out_ptr, part_acc_ptr, part_ml_ptr,
                    counter_ptr, num_splits, stride_ot, stride_oh, G, G_PAD, D, DIRECT, MERGE,
                    S_PAD)


def decode_qk_norm_rope_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,  # [T, H | Hkv, D], raw qkv views
    cos: torch.Tensor, sin: torch.Tensor,  # [T, 1, D]
    q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float,
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, Hkv, D], q's dtype
    seq_lens: torch.Tensor, block_tables: torch.Tensor, slot_mapping: torch.Tensor,
    scale: float, sliding_window: int, out: torch.Tensor, config: DecodeConfig,
    num_splits: int | None = None,
    order: torch.Tensor | None = None,  # [B] int32: the sequences, longest context first
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,  # [Hq]: each head's sink logit (GPT-OSS)
    alibi_slopes: torch.Tensor | None = None,  # [Hq] float32: ALiBi's slopes
) -> torch.Tensor:
    """An all-decode batch (row b: sequence b's one new token) from raw q/k/v: the rotated k
    and v of rows b < B with seq_lens[b] > 0 written at slot_mapping[b] (negative: none), and
    decode attention of the normed, rotated q into out [T, Hq, D] (rows >= B left as they
    are). No host sync. order orders the programs' launch only (decode.program_seq); softcap
    > 0: scores soft-capped; sinks: a logit per head in every softmax; alibi_slopes: ALiBi
    (the newest key sits at the query's position: no bias)."""
    if any(x.stride(-1) != 1 for x in (q, k, v, cos, sin)):
        raise ValueError("q, k, v, cos and sin must have a contiguous last dim")
    if kv_cache.dtype != q.dtype:
        raise ValueError(f"the one-launch decode takes a cache of q's dtype (FP8 caches take "
                         f"the two kernels), got {kv_cache.dtype} for {q.dtype}")
    plan = plan_splits(q, kv_cache, seq_lens, block_tables, out, config, num_splits)
    num_seqs, head_dim, num_kv_heads = seq_lens.shape[0], q.shape[2], kv_cache.shape[3]
    group_size, padded = group_pad(q.shape[1], num_kv_heads)
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    _decode_qk_split_kernel[(num_seqs, num_kv_heads, plan.num_splits)](
        q, k, v, cos, sin, q if q_weight is None else q_weight,
        k if k_weight is None else k_weight, eps, slot_mapping, k_cache, v_cache, block_tables,
        seq_lens, seq_lens if order is None else order, out, plan.part_acc, plan.part_ml,
        seq_lens if plan.counters is None else plan.counters, q if sinks is None else sinks,
        q if alibi_slopes is None else alibi_slopes, scale * LOG2E, sliding_window,
        plan.num_splits, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
        v.stride(1), cos.stride(0), sin.stride(0), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        G=group_size, G_PAD=padded, BLOCK_N=config.block_n, D=head_dim, BS=kv_cache.shape[2],
        HKV=num_kv_heads, HAS_WINDOW=sliding_window > 0, HAS_Q_NORM=q_weight is not None,
        HAS_K_NORM=k_weight is not None, SOFTCAP=softcap * LOG2E, SINKS=sinks is not None,
        ALIBI=alibi_slopes is not None, num_warps=config.num_warps,
        num_stages=config.num_stages, **plan.launch_args(q, order),
    )
    merge_splits(plan, out, seq_lens, sliding_window)
    return out
