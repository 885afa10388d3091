"""Triton kernel writing this step's K/V rows into the paged cache through the slot mapping.

Cache layout [2, num_blocks, block_size, Hkv, D]; slot s lives in block s // block_size at
offset s % block_size. Negative slots are skipped (rows that own no cache slot). An FP8 cache
holds each row divided by its head's scale.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from compiled_llm.gemm import pdl
from compiled_llm.gemm.pdl import dependency_sync


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, slot_ptr, k_cache_ptr, v_cache_ptr, scales_ptr, fp8_max,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch,
    BS: tl.constexpr, H: tl.constexpr, H_PAD: tl.constexpr, D: tl.constexpr,
    FP8: tl.constexpr = False, PDL: tl.constexpr = 0,
):
    dependency_sync(PDL)
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    offs_h = tl.arange(0, H_PAD)
    offs_d = tl.arange(0, D)
    mask = (offs_h < H)[:, None]
    src_k = k_ptr + t.to(tl.int64) * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :]
    src_v = v_ptr + t.to(tl.int64) * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :]
    dst = (slot // BS) * stride_cb + (slot % BS) * stride_cs
    dst_offs = dst + offs_h[:, None] * stride_ch + offs_d[None, :]
    k = tl.load(src_k, mask=mask)
    v = tl.load(src_v, mask=mask)
    if FP8:  # rows / per-head scale, saturated: the format has no infinities
        k_scale = tl.load(scales_ptr + offs_h, mask=offs_h < H, other=1.0)[:, None]
        v_scale = tl.load(scales_ptr + H + offs_h, mask=offs_h < H, other=1.0)[:, None]
        k = tl.clamp(k.to(tl.float32) / k_scale, -fp8_max, fp8_max)
        v = tl.clamp(v.to(tl.float32) / v_scale, -fp8_max, fp8_max)
    tl.store(k_cache_ptr + dst_offs, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst_offs, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def _last_dim_contiguous(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.stride(-1) == 1 else tensor.contiguous()


def write_kv_cache(
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,  # [T, Hkv, D]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, Hkv, D]
    slot_mapping: torch.Tensor,  # [>= n] int: slot per row, < 0 skips the row
    kv_scales: torch.Tensor | None = None,  # [2, Hkv] float32: the cache is FP8
) -> None:
    """Scatter rows min(T, len(slot_mapping)) of k/v into the cache (an FP8 cache gets
    row / kv_scales); no host sync."""
    num_rows = min(k.shape[0], slot_mapping.shape[0])
    if num_rows == 0:
        return
    _, _, block_size, num_kv_heads, head_dim = kv_cache.shape
    if kv_cache.stride(-1) != 1 or kv_cache[0].stride() != kv_cache[1].stride():
        raise ValueError("kv_cache must have a contiguous last dim and equal K/V strides")
    k, v = _last_dim_contiguous(k), _last_dim_contiguous(v)
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    fp8 = kv_scales is not None
    _write_kv_kernel[(num_rows,)](
        k, v, slot_mapping, k_cache, v_cache, kv_scales if fp8 else slot_mapping,
        torch.finfo(kv_cache.dtype).max if fp8 else 0.0,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        BS=block_size, H=num_kv_heads, H_PAD=triton.next_power_of_2(num_kv_heads), D=head_dim,
        FP8=fp8, num_warps=4 if num_kv_heads * head_dim >= 1024 else 1,
        **pdl.launch_kwargs(k.device),
    )
