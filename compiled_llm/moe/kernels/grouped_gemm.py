"""The grouped GEMM of the fused MoE: one Triton kernel over the rows that moe_align_block_size
grouped by expert, each block of BLOCK_M rows times its expert's weight. Gated (w13): gate and
up tiles in one pass and silu(gate) * up in the epilogue; else (w2): the routing weight of each
row applied in the epilogue. Blocks past the rows in use return at once (read on device).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from compiled_llm.moe.kernels.align import AlignedRouting


@dataclass(frozen=True)
class MoeGemmConfig:
    """Tile shape and launch parameters of the grouped GEMM."""

    block_m: int = 64  # rows (routed tokens) per program: one expert each
    block_n: int = 64
    block_k: int = 64
    group_m: int = 8  # row blocks sharing a column stripe, for L2 reuse of the weights
    num_warps: int = 4
    num_stages: int = 3


@triton.jit
def _moe_gemm_kernel(
    a_ptr, b_ptr, c_ptr, weights_ptr, sorted_ids_ptr, expert_ids_ptr, num_post_padded_ptr,
    N, K, num_entries, num_rows,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
    A_ROW_DIV: tl.constexpr, GATED: tl.constexpr, MUL_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, PREC: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(num_rows, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * num_pid_n)
    first_m = group * GROUP_M
    group_size = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_pid_n)) % group_size
    pid_n = (pid % (GROUP_M * num_pid_n)) // group_size
    if pid_m * BLOCK_M >= tl.load(num_post_padded_ptr):
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    entry = tl.load(sorted_ids_ptr + offs_m)  # flat (token, slot); num_entries marks padding
    row_ok = entry < num_entries
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_rows = (entry // A_ROW_DIV).to(tl.int64)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = (b_ptr + expert * stride_be + offs_n[None, :].to(tl.int64) * stride_bn
              + offs_k[:, None] * stride_bk)  # [BLOCK_K, BLOCK_N] of W^T
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k_start in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k_start
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc += tl.dot(a, b, input_precision=PREC)
        if GATED:  # up rows sit N rows below the gate rows in w13
            b_up = tl.load(b_ptrs + N * stride_bn, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            acc_up += tl.dot(a, b_up, input_precision=PREC)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if GATED:
        acc = acc * tl.sigmoid(acc) * acc_up
    if MUL_WEIGHT:
        acc = acc * tl.load(weights_ptr + entry, mask=row_ok, other=0.0)[:, None]
    c_ptrs = c_ptr + entry.to(tl.int64)[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


def moe_gemm(a: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, routing: AlignedRouting,
             topk_weights: torch.Tensor | None, gated: bool, a_row_div: int,
             config: MoeGemmConfig) -> torch.Tensor:
    """out[entry] = f(a[entry // a_row_div] @ weight[expert(entry)]^T) for every routed entry:
    gated, weight [E, 2N, K] and f = silu(gate) * up; else weight [E, N, K], scaled by
    topk_weights[entry] when given. out is [T * top_k, N]."""
    num_out = weight.shape[1] // 2 if gated else weight.shape[1]
    reduce_dim = weight.shape[2]
    num_rows = routing.sorted_ids.numel()
    if routing.block_m != config.block_m:
        raise ValueError(f"routing aligned to {routing.block_m} rows, config has {config.block_m}")
    grid = (triton.cdiv(num_rows, config.block_m) * triton.cdiv(num_out, config.block_n),)
    _moe_gemm_kernel[grid](
        a, weight, out, topk_weights if topk_weights is not None else out,
        routing.sorted_ids, routing.expert_ids, routing.num_post_padded,
        num_out, reduce_dim, routing.num_entries, num_rows,
        a.stride(0), a.stride(1), weight.stride(0), weight.stride(1), weight.stride(2),
        out.stride(0), out.stride(1),
        A_ROW_DIV=a_row_div, GATED=gated, MUL_WEIGHT=topk_weights is not None,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        GROUP_M=config.group_m, PREC="ieee" if a.dtype == torch.float32 else "tf32",
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out
