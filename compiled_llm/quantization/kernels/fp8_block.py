"""Block-FP8 Triton GEMM (CUDA, sm89+): activations quantized per token and group of 128
inputs in one launch, weights e4m3 with one scale per 128x128 block (expanded per row); each
K-tile is one block, so its FP8 tl.dot result is scaled by the token's and the block's scales.
Small M takes a split-K path with float32 partial sums, as the W4A16 kernel does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from compiled_llm.passes.quant_ops import FP8_MAX, MIN_SCALE
from compiled_llm.quantization.fp8_groups import FP8_BLOCK as BLOCK
from compiled_llm.quantization.fp8_groups import quant_fp8_groups
from compiled_llm.quantization.kernels.tiles import load_rows, program_tiles, store_tile

GROUPS_PER_PROGRAM = 8


@triton.jit
def _quant_groups_kernel(x_ptr, q_ptr, s_ptr, K, stride_xm, stride_qm, stride_sm, stride_sg,
                         FP8_MAX: tl.constexpr, MIN_SCALE: tl.constexpr, GROUPS: tl.constexpr,
                         BLOCK: tl.constexpr):
    """Row program_id(0), groups [GROUPS * program_id(1), +GROUPS) of 128 inputs: amax per
    group, scale = max(amax / FP8_MAX, MIN_SCALE), q = clamp(x / scale) in e4m3."""
    row = tl.program_id(0)
    group = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    cols = group[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]  # [GROUPS, BLOCK]
    ok = cols < K
    x = tl.load(x_ptr + row * stride_xm + cols, mask=ok, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=1) / FP8_MAX, MIN_SCALE)
    q = tl.clamp(x / scale[:, None], -FP8_MAX, FP8_MAX)
    tl.store(q_ptr + row * stride_qm + cols, q.to(q_ptr.dtype.element_ty), mask=ok)
    tl.store(s_ptr + row * stride_sm + group * stride_sg, scale, mask=group * BLOCK < K)


def quant_fp8_groups_triton(x: torch.Tensor, m_major: bool = False
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """quant_fp8_groups in one launch: x [M, K] -> (q e4m3 [M, K], scale f32 [M, K / 128]),
    the scales M-major (stride (1, M), the layout cuBLAS's block scaling reads) if asked."""
    (m, k), groups = x.shape, x.shape[1] // BLOCK
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    scale = (torch.empty((groups, m), dtype=torch.float32, device=x.device).t() if m_major
             else torch.empty((m, groups), dtype=torch.float32, device=x.device))
    grid = (m, triton.cdiv(groups, GROUPS_PER_PROGRAM))
    _quant_groups_kernel[grid](x, q, scale, k, x.stride(0), q.stride(0), scale.stride(0),
                               scale.stride(1), FP8_MAX=FP8_MAX, MIN_SCALE=MIN_SCALE,
                               GROUPS=GROUPS_PER_PROGRAM, BLOCK=BLOCK)
    return q, scale


@triton.jit
def _fp8_block_kernel(xq_ptr, xs_ptr, w_ptr, ws_ptr, out_ptr, M, N, K, stride_xm, stride_xsm,
                      stride_xsg, stride_wn, stride_wsn, stride_os, stride_om,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      SPLIT_K: tl.constexpr):
    offs_m, offs_n, row_ok, col_ok, offs_k, first, end, acc = program_tiles(
        M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K)
    for tile in range(first, end):
        k = tile * BLOCK_K + offs_k
        x = load_rows(xq_ptr, offs_m, k, stride_xm, row_ok)
        w = tl.load(w_ptr + offs_n[None, :] * stride_wn + k[:, None], mask=col_ok[None, :],
                    other=0.0)
        x_scale = tl.load(xs_ptr + offs_m * stride_xsm + tile * stride_xsg, mask=row_ok,
                          other=0.0)
        w_scale = tl.load(ws_ptr + offs_n * stride_wsn + tile, mask=col_ok, other=0.0)
        acc += tl.dot(x, w) * x_scale[:, None] * w_scale[None, :]
    store_tile(out_ptr, acc, offs_m, offs_n, row_ok, col_ok, stride_os, stride_om)


def fp8_block_gemm_triton(x: torch.Tensor, weight: torch.Tensor,
                          weight_scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ (weight [N, K] * weight_scale [N, K / 128]).T -> [M, N] in x's dtype."""
    if x.shape[1] % BLOCK or weight.shape[1] != x.shape[1]:
        raise ValueError(f"block FP8 needs K a multiple of {BLOCK} matching the weight, got "
                         f"x {tuple(x.shape)}, weight {tuple(weight.shape)}")
    # Triton's interpreter rounds to e4m3 without the binade carry: torch's cast off CUDA
    quant = quant_fp8_groups_triton if x.is_cuda else quant_fp8_groups
    x_q, x_scale = quant(x.contiguous())
    (m, k), n = x.shape, weight.shape[0]
    small = m <= 16
    block_m, block_n = (16, 64) if small else (64 if m > 64 else 32, 128)
    split = max(1, min(k // BLOCK, 256 // triton.cdiv(n, block_n), 8)) if small else 1
    out = x.new_empty((split, m, n), dtype=torch.float32 if split > 1 else x.dtype)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n), split)
    _fp8_block_kernel[grid](x_q, x_scale, weight, weight_scale, out, m, n, k, x_q.stride(0),
                            x_scale.stride(0), x_scale.stride(1), weight.stride(0),
                            weight_scale.stride(0),
                            out.stride(0), out.stride(1), BLOCK_M=block_m, BLOCK_N=block_n,
                            BLOCK_K=BLOCK, SPLIT_K=split, num_warps=4, num_stages=3)
    return out[0] if split == 1 else out.sum(0).to(x.dtype)
