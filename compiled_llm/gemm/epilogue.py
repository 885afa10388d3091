"""What follows a small-M GEMM, fused: the residual add + RMSNorm in the kernel that sums the
split-K partials (one program per row: the sum in split order, rounded, added, normalized as the
models' helpers round; one "split" is a finished product, cuBLAS's say), and the SiLU·mul of a
gate/up product for token counts past the GATE_UP epilogue's (kernels.py)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from compiled_llm.gemm import pdl
from compiled_llm.gemm.kernels import inductor_exp, inductor_rsqrt
from compiled_llm.gemm.pdl import dependency_sync


@triton.jit
def _sum_add_rms_norm_kernel(part_ptr, res_ptr, w_ptr, normed_ptr, summed_ptr, N, stride_split,
                             stride_res, eps, SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr,
                             PDL: tl.constexpr):
    dependency_sync(PDL)
    row = tl.program_id(0).to(tl.int64)  # row * N passes 2**31 in long prefills
    offs = tl.arange(0, BLOCK_N)
    ok = offs < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for split in tl.static_range(SPLIT_K):
        part = tl.load(part_ptr + split * stride_split + row * N + offs, mask=ok, other=0.0)
        acc += part.to(tl.float32)
    dtype = summed_ptr.dtype.element_ty
    residual = tl.load(res_ptr + row * stride_res + offs, mask=ok, other=0.0)
    # the GEMM's output, then x + residual, each rounded to the activation dtype
    summed = (acc.to(dtype).to(tl.float32) + residual.to(tl.float32)).to(dtype)
    tl.store(summed_ptr + row * N + offs, summed, mask=ok)
    summed_f32 = summed.to(tl.float32)
    rstd = inductor_rsqrt(tl.sum(summed_f32 * summed_f32, axis=0) / N + eps)
    weight = tl.load(w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    normed = weight * (summed_f32 * rstd).to(dtype).to(tl.float32)
    tl.store(normed_ptr + row * N + offs, normed.to(normed_ptr.dtype.element_ty), mask=ok)


def _num_warps(block_n: int) -> int:
    return max(1, min(16, block_n // 256))


def sum_add_rms_norm(partials: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """partials [S, M, N] (split-K partials in split order, or [1, M, N] of a product) and
    residual [M, N] -> (rms_norm(y + residual), y + residual), y the partials' sum rounded to
    residual's dtype. Invariant: the same rounding as the unfused ops, the sum's order included."""
    splits, rows, width = partials.shape
    if residual.shape != (rows, width) or residual.stride(1) != 1 or not partials.is_contiguous():
        raise ValueError(f"residual {tuple(residual.shape)} does not fit partials "
                         f"{tuple(partials.shape)} (both row-major)")
    summed = torch.empty((rows, width), dtype=residual.dtype, device=residual.device)
    normed = torch.empty((rows, width), device=residual.device,
                         dtype=torch.promote_types(residual.dtype, norm_weight.dtype))
    if rows == 0:
        return normed, summed
    block_n = triton.next_power_of_2(width)
    _sum_add_rms_norm_kernel[(rows,)](
        partials, residual, norm_weight, normed, summed, width, rows * width, residual.stride(0),
        eps, SPLIT_K=splits, BLOCK_N=block_n, num_warps=_num_warps(block_n),
        **pdl.launch_kwargs(residual.device))
    return normed, summed


@triton.jit
def _silu_mul_kernel(src_ptr, out_ptr, width, stride_src, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < width
    gate = tl.load(src_ptr + row * stride_src + offs, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(src_ptr + row * stride_src + width + offs, mask=ok, other=0.0).to(tl.float32)
    act = gate / (inductor_exp(-gate) + 1.0) * up  # Inductor's SiLU·mul: float32, rounded once
    tl.store(out_ptr + row * width + offs, act.to(out_ptr.dtype.element_ty), mask=ok)


def silu_mul_halves(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [M, 2I] -> silu(gate) * up [M, I], rounded once as the small-M kernel's GATE_UP
    epilogue and Inductor's kernel round it (the epilogue's fallback past its token counts)."""
    rows, width = gate_up.shape[0], gate_up.shape[1] // 2
    if gate_up.stride(1) != 1 or gate_up.shape[1] % 2:
        raise ValueError(f"gate_up {tuple(gate_up.shape)} needs an even, contiguous last dim")
    out = gate_up.new_empty((rows, width))
    if rows:
        block = min(1024, triton.next_power_of_2(width))
        _silu_mul_kernel[(rows, triton.cdiv(width, block))](
            gate_up, out, width, gate_up.stride(0), BLOCK=block, num_warps=4)
    return out
