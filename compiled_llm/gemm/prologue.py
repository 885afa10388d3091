"""The small-M GEMM after a residual add + RMSNorm, in one kernel: each program sums the GEMM
before's split-K partials, adds the residual and normalizes the rows itself (a prologue into its
own scratch rows, rounded as epilogue.sum_add_rms_norm rounds), then runs kernels.py's product
over them, so no kernel runs between the two GEMMs. For few rows: M x K in one program's
registers."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from compiled_llm.gemm import pdl
from compiled_llm.gemm.kernels import block_m, check_config, gemm_tile, inductor_rsqrt, sum_splits
from compiled_llm.gemm.pdl import dependency_sync
from compiled_llm.gemm.tuning import SmallMConfig

# rows x K (each a power of two) of the add + RMSNorm prologue, held in one program's registers
NORM_PROLOGUE_ELEMENTS = 4096


@triton.jit
def _add_rms_norm_rows(part_ptr, res_ptr, nw_ptr, summed_ptr, normed_ptr, M, K, stride_res,
                       eps, first, S_IN: tl.constexpr, ROWS: tl.constexpr,
                       K_PAD: tl.constexpr):
    """normed [M, K] = rms_norm(summed) stored at normed_ptr, summed = the S_IN float32 partials'
    sum + residual (stored too where first), rounded as epilogue.sum_add_rms_norm rounds them;
    then a CTA barrier, so this program's threads read back each other's stores."""
    offs_m = tl.arange(0, ROWS)
    offs_k = tl.arange(0, K_PAD)
    ok = (offs_m < M)[:, None] & (offs_k < K)[None, :]
    rows = offs_m[:, None] * K + offs_k[None, :]
    acc = tl.zeros((ROWS, K_PAD), dtype=tl.float32)
    for split in tl.static_range(S_IN):
        acc += tl.load(part_ptr + split * M * K + rows, mask=ok, other=0.0).to(tl.float32)
    dtype = summed_ptr.dtype.element_ty
    residual = tl.load(res_ptr + offs_m[:, None] * stride_res + offs_k[None, :], mask=ok,
                       other=0.0)
    summed = (acc.to(dtype).to(tl.float32) + residual.to(tl.float32)).to(dtype)
    if first:
        tl.store(summed_ptr + rows, summed, mask=ok)
    summed_f32 = summed.to(tl.float32)
    rstd = inductor_rsqrt(tl.sum(summed_f32 * summed_f32, axis=1) / K + eps)  # [ROWS]
    weight = tl.load(nw_ptr + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
    normed = weight[None, :] * (summed_f32 * rstd[:, None]).to(dtype).to(tl.float32)
    tl.store(normed_ptr + rows, normed.to(normed_ptr.dtype.element_ty), mask=ok)
    tl.debug_barrier()


@triton.jit
def _small_m_norm_kernel(part_in_ptr, res_ptr, nw_ptr, summed_ptr, scratch_ptr, w_ptr, out_ptr,
                         part_ptr, M, N, K, stride_res, stride_wn, stride_os, eps,
                         S_IN: tl.constexpr, ROWS: tl.constexpr, K_PAD: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, USE_DOT: tl.constexpr,
                         PRECISION: tl.constexpr, PDL: tl.constexpr, GATE_UP: tl.constexpr):
    """Each program: the residual add + RMSNorm of the GEMM before's partials into its own
    scratch rows (a prologue), then its products over them."""
    dependency_sync(PDL)
    program = tl.program_id(0) * SPLIT_K + tl.program_id(1)
    normed_ptr = scratch_ptr + program.to(tl.int64) * M * K
    _add_rms_norm_rows(part_in_ptr, res_ptr, nw_ptr, summed_ptr, normed_ptr, M, K, stride_res,
                       eps, program == 0, S_IN, ROWS, K_PAD)
    gemm_tile(normed_ptr, normed_ptr, w_ptr, out_ptr, part_ptr, out_ptr, M, N, K, K, K,
               stride_wn, stride_os, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, EVEN_K, USE_DOT,
               PRECISION, False, False, 0, GATE_UP)


def norm_prologue_fits(m: int, k: int) -> bool:
    """Whether the add + RMSNorm prologue takes m rows of width k (batch 1 of a 4096-wide model,
    up to 4 tokens of a 1024-wide one)."""
    return triton.next_power_of_2(m) * triton.next_power_of_2(k) <= NORM_PROLOGUE_ELEMENTS


def small_m_norm_mm_triton(partials: torch.Tensor, residual: torch.Tensor,
                           norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
                           config: SmallMConfig,
                           gate_up: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(s) @ weight^T, s), s = the sum of partials [S, M, K] (kernels.small_m_partials)
    + residual [M, K], rounded as sum_add_rms_norm rounds: every program makes the
    normed rows itself (a prologue into its own scratch rows), so no kernel runs between the two
    GEMMs. gate_up: the GATE_UP epilogue (split_k 1). Needs norm_prologue_fits(M, K)."""
    splits_in, m, k = partials.shape
    if not norm_prologue_fits(m, k) or residual.shape != (m, k) or residual.stride(1) != 1:
        raise ValueError(f"the norm prologue takes [M, K] rows with M * K <= "
                         f"{NORM_PROLOGUE_ELEMENTS}, got partials {tuple(partials.shape)} and "
                         f"residual {tuple(residual.shape)}")
    if gate_up and (config.split_k != 1 or weight.shape[0] % 2):
        raise ValueError("the gate/up epilogue needs split_k 1 and an even N")
    check_config(m, config)
    n = weight.shape[0] // 2 if gate_up else weight.shape[0]
    weight, dtype = weight.contiguous(), residual.dtype
    summed = torch.empty((m, k), dtype=dtype, device=residual.device)
    out = torch.empty((m, n), dtype=dtype, device=residual.device)
    split, blocks = config.split_k, triton.cdiv(n, config.block_n)
    scratch = torch.empty((blocks * split, m, k), dtype=dtype, device=residual.device)
    part = out if split == 1 else torch.empty((split, m, n), dtype=torch.float32,
                                              device=residual.device)
    _small_m_norm_kernel[(blocks, split)](
        partials.contiguous(), residual, norm_weight, summed, scratch, weight, out, part, m, n,
        k, residual.stride(0), weight.stride(0), m * n, eps, S_IN=splits_in,
        ROWS=triton.next_power_of_2(m), K_PAD=triton.next_power_of_2(k),
        BLOCK_M=block_m(m, config.use_dot), BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        SPLIT_K=split, EVEN_K=k % config.block_k == 0, USE_DOT=config.use_dot,
        PRECISION="ieee" if dtype == torch.float32 else "tf32", GATE_UP=gate_up,
        num_warps=config.num_warps, num_stages=config.num_stages,
        **pdl.launch_kwargs(residual.device))
    if split > 1:
        sum_splits(part, out)
    return out, summed
