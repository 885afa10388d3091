"""The grouped GEMM of the fused MoE: one Triton kernel over the rows moe_align_block_size grouped
by expert, each block of BLOCK_M rows times its expert's weight. Gated (w13): gate and up tiles in
one pass, act(gate, up) in the epilogue; else (w2): each row's routing weight applied. Optional
per-expert bias before either. Block FP8: each K-tile's dot scaled by its rows' and columns'
block scales. Blocks past the rows in use return; another rank's expert stores 0."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from compiled_llm.moe.kernels.align import AlignedRouting
from compiled_llm.moe.reference import SILU, GatedActivation


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
def _grouped_pids(num_rows, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  GROUP_M: tl.constexpr):
    """(row block, column block) of this program, GROUP_M row blocks per column stripe."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(num_rows, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    first_m = pid // (GROUP_M * num_pid_n) * GROUP_M
    group_size = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_pid_n)) % group_size
    return pid_m, (pid % (GROUP_M * num_pid_n)) // group_size


@triton.jit
def _row_scales(ptrs, row_ok, SCALED: tl.constexpr):
    """The rows' activation scales of this K-tile (1 when not block scaled)."""
    if SCALED:
        return tl.load(ptrs, mask=row_ok, other=0.0)
    else:  # an explicit else: Triton 3.6 also compiles a fall-through return (type mismatch)
        return 1.0


@triton.jit
def _tile_dot(a, b, a_scale, b_scale_ptrs, n_ok, SCALED: tl.constexpr, PREC: tl.constexpr):
    """a @ b for one K-tile, times the rows' and the columns' block scales when SCALED."""
    if SCALED:
        b_scale = tl.load(b_scale_ptrs, mask=n_ok, other=0.0)
        return tl.dot(a, b) * a_scale[:, None] * b_scale[None, :]
    return tl.dot(a, b, input_precision=PREC)


@triton.jit
def _add_biases(acc, acc_up, ptrs, n_ok, up_offset, GATED: tl.constexpr):
    """acc (and acc_up when GATED) plus this column block of the expert's biases, float32."""
    acc = acc + tl.load(ptrs, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if GATED:  # up's biases sit N below the gate's, as up's rows do in w13
        acc_up = acc_up + tl.load(ptrs + up_offset, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    return acc, acc_up


@triton.jit
def _gated_act(gate, up, alpha, limit, ACTIVATION: tl.constexpr):
    """act(gate, up) of float32 tiles: silu(gate) * up, GPT-OSS's clamped (up + 1) * glu, or
    gelu_tanh(gate) * up (Gemma 4): 0.5 * (1 + tanh(z)) is sigmoid(2z)."""
    if ACTIVATION == "gelu_tanh":
        inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        return gate * tl.sigmoid(2.0 * inner) * up
    if ACTIVATION == "swigluoai":
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
        return (up + 1.0) * gate * tl.sigmoid(alpha * gate)
    return gate * tl.sigmoid(gate) * up


@triton.jit
def _moe_gemm_kernel(
    a_ptr, b_ptr, c_ptr, weights_ptr, sorted_ids_ptr, expert_ids_ptr, num_post_padded_ptr,
    a_scale_ptr, b_scale_ptr, bias_ptr,
    N, K, num_entries, num_rows, num_experts,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
    stride_asm, stride_bse, stride_bsn, stride_bsk, stride_biase, stride_biasn, alpha, limit,
    A_ROW_DIV: tl.constexpr, GATED: tl.constexpr, MUL_WEIGHT: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
    SCALED: tl.constexpr, SCALE_BLOCK_N: tl.constexpr, SCALE_BLOCK_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, PREC: tl.constexpr,
):
    pid_m, pid_n = _grouped_pids(num_rows, N, BLOCK_M, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(num_post_padded_ptr):
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    entry = tl.load(sorted_ids_ptr + offs_m)  # flat (token, slot); num_entries marks padding
    row_ok = entry < num_entries
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    c_ptrs = c_ptr + entry.to(tl.int64)[:, None] * stride_cm + offs_n[None, :] * stride_cn
    if expert >= num_experts:  # another rank's expert: its rows add zero to the token's sum
        if not GATED:
            zeros = tl.zeros((BLOCK_M, BLOCK_N), dtype=c_ptr.dtype.element_ty)
            tl.store(c_ptrs, zeros, mask=row_ok[:, None] & n_ok[None, :])
        return
    offs_k = tl.arange(0, BLOCK_K)
    a_rows = (entry // A_ROW_DIV).to(tl.int64)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = (b_ptr + expert * stride_be + offs_n[None, :].to(tl.int64) * stride_bn
              + offs_k[:, None] * stride_bk)  # [BLOCK_K, BLOCK_N] of W^T
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    bs_base = b_scale_ptr + expert * stride_bse
    bs_cols = (offs_n // SCALE_BLOCK_N) * stride_bsn
    bs_up_cols = ((offs_n + N) // SCALE_BLOCK_N) * stride_bsn  # up rows: N below the gate's
    for k_start in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k_start
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        k_group = k_start // SCALE_BLOCK_K  # BLOCK_K divides SCALE_BLOCK_K: one group a tile
        a_scale = _row_scales(a_scale_ptr + a_rows * stride_asm + k_group, row_ok, SCALED)
        bs_ptr = bs_base + k_group * stride_bsk
        acc += _tile_dot(a, b, a_scale, bs_ptr + bs_cols, n_ok, SCALED, PREC)
        if GATED:  # up rows sit N rows below the gate rows in w13
            b_up = tl.load(b_ptrs + N * stride_bn, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            acc_up += _tile_dot(a, b_up, a_scale, bs_ptr + bs_up_cols, n_ok, SCALED, PREC)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if HAS_BIAS:
        bias_ptrs = bias_ptr + expert * stride_biase + offs_n * stride_biasn
        acc, acc_up = _add_biases(acc, acc_up, bias_ptrs, n_ok, N * stride_biasn, GATED)
    if GATED:
        acc = _gated_act(acc, acc_up, alpha, limit, ACTIVATION)
    if MUL_WEIGHT:
        acc = acc * tl.load(weights_ptr + entry, mask=row_ok, other=0.0)[:, None]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


def moe_gemm(a: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, routing: AlignedRouting,
             topk_weights: torch.Tensor | None, gated: bool, a_row_div: int,
             config: MoeGemmConfig, a_scale: torch.Tensor | None = None,
             b_scale: torch.Tensor | None = None,
             scale_block: tuple[int, int] = (128, 128), bias: torch.Tensor | None = None,
             activation: GatedActivation = SILU) -> torch.Tensor:
    """out[entry] = f(a[entry // a_row_div] @ weight[expert(entry)]^T + bias[expert]) for every
    routed entry: gated, weight [E, 2N, K], bias [E, 2N] and f = activation(gate, up); else
    weight [E, N, K], bias [E, N], scaled by topk_weights[entry] when given (after the bias).
    out is [T * top_k, N]. Block-scaled (a_scale [rows of a, K / scale_block[1]], b_scale
    [E, 2N or N / scale_block[0], K / scale_block[1]]): a and weight are quantized values,
    config.block_k must divide scale_block[1]."""
    num_out = weight.shape[1] // 2 if gated else weight.shape[1]
    reduce_dim = weight.shape[2]
    num_rows = routing.sorted_ids.numel()
    if routing.block_m != config.block_m:
        raise ValueError(f"routing aligned to {routing.block_m} rows, config has {config.block_m}")
    scaled = b_scale is not None
    if scaled and (scale_block[1] % config.block_k or a_scale is None):
        raise ValueError(f"block-scaled moe_gemm needs a_scale and block_k dividing "
                         f"{scale_block[1]}, got block_k {config.block_k}")
    scale_strides = (a_scale.stride(0), *b_scale.stride()) if scaled else (0, 0, 0, 0)
    bias_strides = bias.stride() if bias is not None else (0, 0)
    grid = (triton.cdiv(num_rows, config.block_m) * triton.cdiv(num_out, config.block_n),)
    _moe_gemm_kernel[grid](
        a, weight, out, topk_weights if topk_weights is not None else out,
        routing.sorted_ids, routing.expert_ids, routing.num_post_padded,
        a_scale if scaled else out, b_scale if scaled else out, bias if bias is not None else out,
        num_out, reduce_dim, routing.num_entries, num_rows, weight.shape[0],
        a.stride(0), a.stride(1), weight.stride(0), weight.stride(1), weight.stride(2),
        out.stride(0), out.stride(1), *scale_strides, *bias_strides,
        float(activation.alpha), float(activation.limit),
        A_ROW_DIV=a_row_div, GATED=gated, MUL_WEIGHT=topk_weights is not None,
        HAS_BIAS=bias is not None, ACTIVATION=activation.name,
        SCALED=scaled, SCALE_BLOCK_N=scale_block[0], SCALE_BLOCK_K=scale_block[1],
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        GROUP_M=config.group_m, PREC="ieee" if a.dtype == torch.float32 else "tf32",
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out
