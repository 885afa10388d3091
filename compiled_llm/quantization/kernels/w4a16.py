"""W4A16 Triton GEMM over the canonical packed layout (quantization/packing.py): each program
dequantizes its [BLOCK_K, BLOCK_N] weight tile in the main loop and feeds tl.dot, so weights
cross memory as 4-bit words. Small M (decode) takes a split-K path: programs split K too and
write float32 partial sums that one reduction adds up.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from compiled_llm.attention.kernels import kernels_interpreted
from compiled_llm.quantization.kernels.tiles import load_rows, program_tiles, store_tile

GEMV_MAX_M = 16  # up to this many rows, the split-K path


@dataclass(frozen=True)
class W4A16Config:
    """Tile sizes and K split of one launch; block_k divides the group size."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int = 4
    num_stages: int = 3


@triton.jit
def _w4a16_kernel(x_ptr, qweight_ptr, scales_ptr, zeros_ptr, out_ptr, M, N, K,
                  stride_xm, stride_qn, stride_sn, stride_zn, stride_os, stride_om,
                  GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, PRECISION: tl.constexpr):
    offs_m, offs_n, row_ok, col_ok, offs_k, first, end, acc = program_tiles(
        M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K)
    for tile in range(first, end):
        k = tile * BLOCK_K + offs_k
        x = load_rows(x_ptr, offs_m, k, stride_xm, row_ok)
        # each packed word is read once: [BLOCK_K / 8, BLOCK_N] words -> 8 nibbles each
        word_rows = tile * (BLOCK_K // 8) + tl.arange(0, BLOCK_K // 8)
        words = tl.load(qweight_ptr + offs_n[None, :] * stride_qn + word_rows[:, None],
                        mask=col_ok[None, :], other=0)
        nibbles = (words[:, None, :] >> (tl.arange(0, 8) * 4)[None, :, None]) & 0xF
        values = tl.reshape(nibbles, (BLOCK_K, BLOCK_N))  # row 8 * word + j: input k order
        group = (tile * BLOCK_K) // GROUP  # BLOCK_K divides GROUP: one group per tile
        scale = tl.load(scales_ptr + offs_n * stride_sn + group, mask=col_ok, other=0.0)
        zero = tl.load(zeros_ptr + offs_n * stride_zn + group, mask=col_ok, other=0)
        weight = (values - zero.to(tl.int32)[None, :]).to(scale.dtype) * scale[None, :]
        acc += tl.dot(x, weight.to(x.dtype), input_precision=PRECISION)
    store_tile(out_ptr, acc, offs_m, offs_n, row_ok, col_ok, stride_os, stride_om)


def w4a16_config(m: int, n: int, k: int, group_size: int) -> W4A16Config:
    """The launch for an [m, k] x [k, n] product: split-K GEMV tiles for m <= GEMV_MAX_M."""
    block_k = min(group_size, 64)
    if m <= GEMV_MAX_M:
        tiles_n = triton.cdiv(n, 64)
        split_k = max(1, min(k // block_k, 256 // max(tiles_n, 1), 16))
        return W4A16Config(16, 64, block_k, split_k, num_stages=4)
    return W4A16Config(32 if m <= 64 else 64, 128, block_k, 1)


def check_w4a16_inputs(x: torch.Tensor, qweight: torch.Tensor, group_size: int) -> None:
    """ValueError unless x [M, K] matches qweight [N, K / 8] and the group size tiles K."""
    if x.device.type != "cuda" and not kernels_interpreted():
        raise ValueError("the W4A16 Triton kernel needs CUDA tensors (or TRITON_INTERPRET=1)")
    if x.dim() != 2 or qweight.shape[1] * 8 != x.shape[1]:
        raise ValueError(f"x {tuple(x.shape)} does not match qweight {tuple(qweight.shape)}")
    if group_size % 16 or x.shape[1] % group_size:
        raise ValueError(f"group_size {group_size} must be a multiple of 16 dividing K")


def w4a16_gemm_triton(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                      zeros: torch.Tensor, group_size: int,
                      config: W4A16Config | None = None) -> torch.Tensor:
    """x [M, K] @ dequant(qweight, scales, zeros).T -> [M, N] in x's dtype."""
    check_w4a16_inputs(x, qweight, group_size)
    x = x.contiguous()
    (m, k), n = x.shape, qweight.shape[0]
    config = config or w4a16_config(m, n, k, group_size)
    split = config.split_k
    out = x.new_empty((split, m, n), dtype=torch.float32 if split > 1 else x.dtype)
    grid = (triton.cdiv(m, config.block_m), triton.cdiv(n, config.block_n), split)
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    _w4a16_kernel[grid](x, qweight, scales, zeros, out, m, n, k, x.stride(0), qweight.stride(0),
                        scales.stride(0), zeros.stride(0), out.stride(0), out.stride(1),
                        GROUP=group_size, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
                        BLOCK_K=config.block_k, SPLIT_K=split, PRECISION=precision,
                        num_warps=config.num_warps, num_stages=config.num_stages)
    return out[0] if split == 1 else out.sum(0).to(x.dtype)
