"""Tile bookkeeping shared by the quantized GEMM kernels: a program's rows, columns and share of
the K-tiles (split-K), and the store of its (partial) result."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def program_tiles(M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """(rows, cols, row mask, col mask, K offsets in a tile, first K-tile, end K-tile, a zero
    float32 accumulator) of this program."""
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_tiles = K // BLOCK_K
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    first = pid_k * per_split
    end = tl.minimum(first + per_split, k_tiles)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    return offs_m, offs_n, offs_m < M, offs_n < N, tl.arange(0, BLOCK_K), first, end, acc


@triton.jit
def store_tile(out_ptr, acc, offs_m, offs_n, row_ok, col_ok, stride_os, stride_om):
    """acc into out[split, rows, cols] (split = this program's K share)."""
    out = out_ptr + tl.program_id(2) * stride_os + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def load_rows(x_ptr, offs_m, k, stride_xm, row_ok):
    """x[rows, k] as a [BLOCK_M, BLOCK_K] tile (rows past M read as zeros)."""
    return tl.load(x_ptr + offs_m[:, None] * stride_xm + k[None, :], mask=row_ok[:, None],
                   other=0.0)
