"""W4A16 Triton GEMM over the canonical packed layout (quantization/packing.py), swap-AB:
out.T = W @ x.T, weight rows on the MMA's wide side; K-contiguous words are read once, unpacked to
exact integers, and the group's zero and scale apply after the dot: s (q . x - z sum(x)). A GEMV
variant (gemv=True, up to 4 rows) skips the MMA. Small M may split K (float32 partials).
Tuned tiles per shape and GPU: w4a16_tuning.py."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from compiled_llm.attention.kernels import kernels_interpreted
from compiled_llm.quantization.kernels.w4a16_tuning import W4A16Config, tuned_w4a16_config

GEMV_MAX_ROWS = 4
__all__ = ["GEMV_MAX_ROWS", "W4A16Config", "w4a16_config", "w4a16_gemm_triton"]


@triton.jit
def _unpacked_tile(qweight_ptr, offs_n, col_ok, tile, stride_qn, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, EXPAND: tl.constexpr):
    """The tile's 4-bit values q[n, k] as int32 [BLOCK_N, BLOCK_K] (k = 8 * word + nibble)."""
    row = qweight_ptr + offs_n[:, None] * stride_qn
    if EXPAND:
        offs_k = tl.arange(0, BLOCK_K)
        words = tl.load(row + (tile * BLOCK_K + offs_k)[None, :] // 8, mask=col_ok[:, None],
                        other=0)
        return (words >> ((offs_k % 8) * 4)[None, :]) & 0xF
    offs_w = tile * (BLOCK_K // 8) + tl.arange(0, BLOCK_K // 8)
    words = tl.load(row + offs_w[None, :], mask=col_ok[:, None], other=0)  # [BN, BK / 8]
    nibbles = (words[:, :, None] >> (tl.arange(0, 8) * 4)[None, None, :]) & 0xF
    return tl.reshape(nibbles, (BLOCK_N, BLOCK_K))


@triton.jit
def _w4a16_kernel(x_ptr, qweight_ptr, scales_ptr, zeros_ptr, out_ptr, M, N, K,
                  stride_xm, stride_qn, stride_sn, stride_zn, stride_os, stride_om,
                  GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, EXPAND: tl.constexpr,
                  PRECISION: tl.constexpr):
    pid_n, pid_k, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    col_ok, row_ok = offs_n < N, offs_m < M
    per_split = tl.cdiv(K // BLOCK_K, SPLIT_K)
    first = pid_k * per_split
    end = tl.minimum(first + per_split, K // BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for tile in range(first, end):
        values = _unpacked_tile(qweight_ptr, offs_n, col_ok, tile, stride_qn, BLOCK_N, BLOCK_K,
                                EXPAND)
        k = tile * BLOCK_K + tl.arange(0, BLOCK_K)
        x_t = tl.load(x_ptr + offs_m[None, :] * stride_xm + k[:, None], mask=row_ok[None, :],
                      other=0.0)  # [BK, BM]
        dot = tl.dot(values.to(x_t.dtype), x_t, input_precision=PRECISION)  # [BN, BM]
        group = (tile * BLOCK_K) // GROUP  # BLOCK_K divides GROUP: one group per tile
        scale = tl.load(scales_ptr + offs_n * stride_sn + group, mask=col_ok, other=0.0)
        zero = tl.load(zeros_ptr + offs_n * stride_zn + group, mask=col_ok, other=0)
        x_sum = tl.sum(x_t.to(tl.float32), axis=0)  # [BM]
        acc += (dot - zero.to(tl.float32)[:, None] * x_sum[None, :]) * \
            scale.to(tl.float32)[:, None]
    out = out_ptr + pid_k * stride_os + offs_m[None, :] * stride_om + offs_n[:, None]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=col_ok[:, None] & row_ok[None, :])


@triton.jit
def _w4a16_gemv_kernel(x_ptr, qweight_ptr, scales_ptr, zeros_ptr, out_ptr, M, N, K,
                       stride_xm, stride_qn, stride_sn, stride_zn, stride_os, stride_om,
                       GROUP: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows, offs_w = tl.arange(0, ROWS), tl.arange(0, BLOCK_K // 8)
    col_ok, row_ok = offs_n < N, rows < M
    per_split = tl.cdiv(K // BLOCK_K, SPLIT_K)
    first = pid_k * per_split
    end = tl.minimum(first + per_split, K // BLOCK_K)
    acc = tl.zeros((ROWS, BLOCK_N, BLOCK_K // 8), dtype=tl.float32)
    for tile in range(first, end):
        word_cols = tile * (BLOCK_K // 8) + offs_w
        words = tl.load(qweight_ptr + offs_n[:, None] * stride_qn + word_cols[None, :],
                        mask=col_ok[:, None], other=0)  # [BN, W]
        x_row = x_ptr + rows[:, None] * stride_xm + word_cols[None, :] * 8  # [R, W]
        dot = tl.zeros((ROWS, BLOCK_N, BLOCK_K // 8), dtype=tl.float32)
        x_sum = tl.zeros((ROWS, BLOCK_K // 8), dtype=tl.float32)
        for j in tl.static_range(8):
            x_j = tl.load(x_row + j, mask=row_ok[:, None], other=0.0).to(tl.float32)
            q_j = ((words >> (4 * j)) & 0xF).to(tl.float32)
            dot += q_j[None, :, :] * x_j[:, None, :]
            x_sum += x_j
        groups = (word_cols * 8) // GROUP  # [W]: the group of each word's 8 inputs
        scale = tl.load(scales_ptr + offs_n[:, None] * stride_sn + groups[None, :],
                        mask=col_ok[:, None], other=0.0).to(tl.float32)
        zero = tl.load(zeros_ptr + offs_n[:, None] * stride_zn + groups[None, :],
                       mask=col_ok[:, None], other=0).to(tl.float32)
        acc += (dot - zero[None, :, :] * x_sum[:, None, :]) * scale[None, :, :]
    out = out_ptr + pid_k * stride_os + rows[:, None] * stride_om + offs_n[None, :]
    tl.store(out, tl.sum(acc, axis=2).to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


def _launch_gemv(x, qweight, scales, zeros, out, group_size: int, config: W4A16Config):
    (m, k), n = x.shape, qweight.shape[0]
    grid = (triton.cdiv(n, config.block_n), config.split_k)
    _w4a16_gemv_kernel[grid](x, qweight, scales, zeros, out, m, n, k, x.stride(0),
                             qweight.stride(0), scales.stride(0), zeros.stride(0),
                             out.stride(0), out.stride(1), GROUP=group_size,
                             ROWS=triton.next_power_of_2(m), BLOCK_N=config.block_n,
                             BLOCK_K=config.block_k, SPLIT_K=config.split_k,
                             num_warps=config.num_warps, num_stages=config.num_stages)


def w4a16_config(m: int, n: int, k: int, group_size: int) -> W4A16Config:
    """The built-in launch for an [m, k] x [k, n] product (no tuned file for the shape): a
    narrow token side for decode, K split until the programs cover the GPU twice."""
    block_k = min(group_size, 128)
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    block_n = 32 if m <= 64 else 128
    programs = triton.cdiv(n, block_n) * triton.cdiv(m, block_m)
    split = 1
    while m <= 64 and programs * split < 264 and split < 8 and k // block_k >= 4 * split:
        split *= 2
    return W4A16Config(block_m, block_n, block_k, split, num_stages=3 if m <= 64 else 2)


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
    config = config or tuned_w4a16_config(m, n, k, x)
    if config is None or k % (config.block_k if config.gemv else group_size):
        config = w4a16_config(m, n, k, group_size)
    split = config.split_k
    out = x.new_empty((split, m, n), dtype=torch.float32 if split > 1 else x.dtype)
    if config.gemv and m <= GEMV_MAX_ROWS:
        _launch_gemv(x, qweight, scales, zeros, out, group_size, config)
    else:
        _launch_mma(x, qweight, scales, zeros, out, group_size, config)
    return out[0] if split == 1 else out.sum(0).to(x.dtype)


def _launch_mma(x, qweight, scales, zeros, out, group_size: int, config: W4A16Config):
    (m, k), n = x.shape, qweight.shape[0]
    grid = (triton.cdiv(n, config.block_n), config.split_k, triton.cdiv(m, config.block_m))
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    _w4a16_kernel[grid](x, qweight, scales, zeros, out, m, n, k, x.stride(0), qweight.stride(0),
                        scales.stride(0), zeros.stride(0), out.stride(0), out.stride(1),
                        GROUP=group_size, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
                        BLOCK_K=config.block_k, SPLIT_K=config.split_k, EXPAND=config.expand,
                        PRECISION=precision, num_warps=config.num_warps,
                        num_stages=config.num_stages)
