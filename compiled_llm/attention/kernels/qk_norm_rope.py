"""Triton kernel from the qkv GEMM output to rotated q and the paged K/V write, in one launch:
one program per (token, group of BLOCK_H heads), q groups first, then k groups (which also write
the rotated k and the v heads into the token's cache slot; FP8: divided by the head's scale).
Rows past the slot mapping, or with a negative slot (padding), write no cache row."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from compiled_llm.attention.metadata import AttentionMetadata
from compiled_llm.gemm import pdl
from compiled_llm.gemm.pdl import dependency_sync

# A head is RMS-normed in float32 and cast to the model dtype where a norm weight is given (the
# models' rms_norm), then rotated by the token's cos/sin, cast to the dtype as the models do
# (rotate-half in float32, one rounding).


@triton.jit
def norm_rope(src, stride_h, heads, mask, w_ptr, cos1, sin1, cos2, sin2, eps,
               D: tl.constexpr, HAS_NORM: tl.constexpr):
    """(first half, second half) of heads [BLOCK_H, D/2] each, normed and rotated, float32."""
    half = tl.arange(0, D // 2)
    offs = heads[:, None] * stride_h + half[None, :]
    x1 = tl.load(src + offs, mask=mask).to(tl.float32)
    x2 = tl.load(src + offs + D // 2, mask=mask).to(tl.float32)
    if HAS_NORM:  # the models' rms_norm: float32 statistics, cast, then weight * x in dtype
        dtype = src.dtype.element_ty
        rstd = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / D + eps)[:, None]
        w1 = tl.load(w_ptr + half).to(tl.float32)[None, :]
        w2 = tl.load(w_ptr + D // 2 + half).to(tl.float32)[None, :]
        x1 = (w1 * (x1 * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        x2 = (w2 * (x2 * rstd).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    return x1 * cos1 - x2 * sin1, x2 * cos2 + x1 * sin2


@triton.jit
def _qk_norm_rope_write_kernel(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, qw_ptr, kw_ptr, q_out_ptr, k_out_ptr,
    slot_ptr, k_cache_ptr, v_cache_ptr, scales_ptr, eps, fp8_max, num_slots,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_cos, stride_sin,
    stride_cb, stride_cs, stride_ch,
    H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
    BLOCK_H: tl.constexpr, HAS_Q_NORM: tl.constexpr, HAS_K_NORM: tl.constexpr,
    FP8: tl.constexpr, PDL: tl.constexpr = 0,
):
    dependency_sync(PDL)
    t = tl.program_id(0).to(tl.int64)
    group = tl.program_id(1)
    q_groups = tl.cdiv(H, BLOCK_H)
    half = tl.arange(0, D // 2)
    dtype = q_ptr.dtype.element_ty  # the models cast cos/sin to the heads' dtype first
    cos1 = tl.load(cos_ptr + t * stride_cos + half).to(dtype).to(tl.float32)[None, :]
    cos2 = tl.load(cos_ptr + t * stride_cos + D // 2 + half).to(dtype).to(tl.float32)[None, :]
    sin1 = tl.load(sin_ptr + t * stride_sin + half).to(dtype).to(tl.float32)[None, :]
    sin2 = tl.load(sin_ptr + t * stride_sin + D // 2 + half).to(dtype).to(tl.float32)[None, :]
    if group < q_groups:
        heads = group * BLOCK_H + tl.arange(0, BLOCK_H)
        mask = (heads < H)[:, None]
        out1, out2 = norm_rope(q_ptr + t * stride_qt, stride_qh, heads, mask, qw_ptr,
                                cos1, sin1, cos2, sin2, eps, D, HAS_Q_NORM)
        dst = q_out_ptr + t * H * D + heads[:, None] * D + half[None, :]
        tl.store(dst, out1.to(q_out_ptr.dtype.element_ty), mask=mask)
        tl.store(dst + D // 2, out2.to(q_out_ptr.dtype.element_ty), mask=mask)
    else:  # Triton needs a name to keep one type across branches: k's get their own
        kv_heads = (group - q_groups) * BLOCK_H + tl.arange(0, BLOCK_H)
        kv_mask = (kv_heads < HKV)[:, None]
        k1, k2 = norm_rope(k_ptr + t * stride_kt, stride_kh, kv_heads, kv_mask, kw_ptr,
                            cos1, sin1, cos2, sin2, eps, D, HAS_K_NORM)
        k1, k2 = k1.to(k_out_ptr.dtype.element_ty), k2.to(k_out_ptr.dtype.element_ty)
        k_dst = k_out_ptr + t * HKV * D + kv_heads[:, None] * D + half[None, :]
        tl.store(k_dst, k1, mask=kv_mask)
        tl.store(k_dst + D // 2, k2, mask=kv_mask)
        slot = tl.load(slot_ptr + t, mask=t < num_slots, other=-1).to(tl.int64)
        if slot >= 0:
            write_rows(k1, k2, v_ptr + t * stride_vt, stride_vh, kv_heads, kv_mask, slot,
                        k_cache_ptr, v_cache_ptr, scales_ptr, fp8_max, stride_cb, stride_cs,
                        stride_ch, HKV, D, BS, FP8)


@triton.jit
def write_rows(k1, k2, v_src, stride_vh, heads, mask, slot, k_cache_ptr, v_cache_ptr,
               scales_ptr, fp8_max, stride_cb, stride_cs, stride_ch,
               HKV: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, FP8: tl.constexpr):
    """Load the v heads, then store_rows."""
    v = tl.load(v_src + heads[:, None] * stride_vh + tl.arange(0, D)[None, :], mask=mask)
    store_rows(k1, k2, v, heads, mask, slot, k_cache_ptr, v_cache_ptr, scales_ptr, fp8_max,
               stride_cb, stride_cs, stride_ch, HKV, D, BS, FP8)


@triton.jit
def store_rows(k1, k2, v, heads, mask, slot, k_cache_ptr, v_cache_ptr, scales_ptr, fp8_max,
               stride_cb, stride_cs, stride_ch,
               HKV: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, FP8: tl.constexpr):
    """Store the rotated k halves and v [heads, D] at `slot` (the cache write kernel's rule)."""
    full = tl.arange(0, D)
    half = tl.arange(0, D // 2)
    row = (slot // BS) * stride_cb + (slot % BS) * stride_cs + heads[:, None] * stride_ch
    k1, k2 = k1.to(tl.float32), k2.to(tl.float32)
    if FP8:  # rows / per-head scale, saturated: the format has no infinities
        k_scale = tl.load(scales_ptr + heads, mask=heads < HKV, other=1.0)[:, None]
        v_scale = tl.load(scales_ptr + HKV + heads, mask=heads < HKV, other=1.0)[:, None]
        k1 = tl.clamp(k1 / k_scale, -fp8_max, fp8_max)
        k2 = tl.clamp(k2 / k_scale, -fp8_max, fp8_max)
        v = tl.clamp(v.to(tl.float32) / v_scale, -fp8_max, fp8_max)
    cache_ty = k_cache_ptr.dtype.element_ty
    tl.store(k_cache_ptr + row + half[None, :], k1.to(cache_ty), mask=mask)
    tl.store(k_cache_ptr + row + D // 2 + half[None, :], k2.to(cache_ty), mask=mask)
    tl.store(v_cache_ptr + row + full[None, :], v.to(cache_ty), mask=mask)


def block_heads(num_tokens: int, num_heads: int) -> int:
    """Heads per program: fewer at small token counts, so a decode step still fills the GPU."""
    return min(triton.next_power_of_2(num_heads), 2 if num_tokens <= 64 else 8)


def qk_norm_rope_kv_write(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,  # [T, H | Hkv, D], last dim contiguous
    cos: torch.Tensor, sin: torch.Tensor,  # [T, 1, D]
    q_weight: torch.Tensor | None, k_weight: torch.Tensor | None, eps: float,
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, Hkv, D]
    meta: AttentionMetadata,
    kv_scales: torch.Tensor | None = None,  # [2, Hkv] float32: the cache is FP8
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rotated q, rotated k), contiguous; writes rotated k and v rows into the cache at
    meta.slot_mapping (rows past it, or with a negative slot, are not written). No host sync."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, block_size = k.shape[1], kv_cache.shape[2]
    if kv_cache.stride(-1) != 1 or kv_cache[0].stride() != kv_cache[1].stride():
        raise ValueError("kv_cache must have a contiguous last dim and equal K/V strides")
    if any(x.stride(-1) != 1 for x in (q, k, v, cos, sin)):
        raise ValueError("q, k, v, cos and sin must have a contiguous last dim")
    q_out, k_out = q.new_empty(q.shape), k.new_empty(k.shape)
    if num_tokens == 0:
        return q_out, k_out
    block = block_heads(num_tokens, max(num_heads, num_kv_heads))
    grid = (num_tokens, triton.cdiv(num_heads, block) + triton.cdiv(num_kv_heads, block))
    slots, fp8 = meta.slot_mapping, kv_scales is not None
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    _qk_norm_rope_write_kernel[grid](
        q, k, v, cos, sin, q_weight if q_weight is not None else q,
        k_weight if k_weight is not None else k, q_out, k_out, slots, k_cache, v_cache,
        kv_scales if fp8 else slots, eps, torch.finfo(kv_cache.dtype).max if fp8 else 0.0,
        slots.shape[0],
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        cos.stride(0), sin.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        H=num_heads, HKV=num_kv_heads, D=head_dim, BS=block_size, BLOCK_H=block,
        HAS_Q_NORM=q_weight is not None, HAS_K_NORM=k_weight is not None, FP8=fp8,
        num_warps=1 if block * head_dim <= 512 else 4, **pdl.launch_kwargs(q.device),
    )
    return q_out, k_out
