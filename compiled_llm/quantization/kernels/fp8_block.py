"""Block-FP8 Triton GEMM (CUDA, sm89+): activations quantized per token and group of 128
inputs, weights e4m3 with one scale per 128x128 block (expanded per row); each K-tile is one
block, so its FP8 tl.dot result is scaled by the token's and the block's scales. Small M takes a
split-K path with float32 partial sums, as the W4A16 kernel does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from compiled_llm.quantization.fp8_groups import FP8_BLOCK as BLOCK
from compiled_llm.quantization.fp8_groups import quant_fp8_groups
from compiled_llm.quantization.kernels.tiles import load_rows, program_tiles, store_tile


@triton.jit
def _fp8_block_kernel(xq_ptr, xs_ptr, w_ptr, ws_ptr, out_ptr, M, N, K,
                      stride_xm, stride_xsm, stride_wn, stride_wsn, stride_os, stride_om,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      SPLIT_K: tl.constexpr):
    offs_m, offs_n, row_ok, col_ok, offs_k, first, end, acc = program_tiles(
        M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K)
    for tile in range(first, end):
        k = tile * BLOCK_K + offs_k
        x = load_rows(xq_ptr, offs_m, k, stride_xm, row_ok)
        w = tl.load(w_ptr + offs_n[None, :] * stride_wn + k[:, None], mask=col_ok[None, :],
                    other=0.0)
        x_scale = tl.load(xs_ptr + offs_m * stride_xsm + tile, mask=row_ok, other=0.0)
        w_scale = tl.load(ws_ptr + offs_n * stride_wsn + tile, mask=col_ok, other=0.0)
        acc += tl.dot(x, w) * x_scale[:, None] * w_scale[None, :]
    store_tile(out_ptr, acc, offs_m, offs_n, row_ok, col_ok, stride_os, stride_om)


def fp8_block_gemm_triton(x: torch.Tensor, weight: torch.Tensor,
                          weight_scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ (weight [N, K] * weight_scale [N, K / 128]).T -> [M, N] in x's dtype."""
    if x.shape[1] % BLOCK or weight.shape[1] != x.shape[1]:
        raise ValueError(f"block FP8 needs K a multiple of {BLOCK} matching the weight, got "
                         f"x {tuple(x.shape)}, weight {tuple(weight.shape)}")
    x_q, x_scale = quant_fp8_groups(x)
    (m, k), n = x.shape, weight.shape[0]
    small = m <= 16
    block_m, block_n = (16, 64) if small else (64 if m > 64 else 32, 128)
    split = max(1, min(k // BLOCK, 256 // triton.cdiv(n, block_n), 8)) if small else 1
    out = x.new_empty((split, m, n), dtype=torch.float32 if split > 1 else x.dtype)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), split)
    _fp8_block_kernel[grid](x_q, x_scale, weight, weight_scale, out, m, n, k, x_q.stride(0),
                            x_scale.stride(0), weight.stride(0), weight_scale.stride(0),
                            out.stride(0), out.stride(1), BLOCK_M=block_m, BLOCK_N=block_n,
                            BLOCK_K=BLOCK, SPLIT_K=split, num_warps=4, num_stages=3)
    return out[0] if split == 1 else out.sum(0).to(x.dtype)
