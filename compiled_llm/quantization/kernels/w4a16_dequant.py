"""W4A16 for prefill sizes: dequantize the canonical packed weight (quantization/packing.py) to
the activation dtype in one pass, then one cuBLAS matmul. At hundreds of tokens and more the
matmul's time dwarfs the pass over the weight; the fused kernels are for decode sizes."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _dequant_kernel(qweight_ptr, scales_ptr, zeros_ptr, out_ptr, N, WORDS, stride_qn,
                    stride_sn, stride_zn, stride_on, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_W: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    words = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    ok = (rows < N)[:, None] & (words < WORDS)[None, :]
    packed = tl.load(qweight_ptr + rows[:, None] * stride_qn + words[None, :], mask=ok, other=0)
    nibbles = (packed[:, :, None] >> (tl.arange(0, 8) * 4)[None, None, :]) & 0xF
    values = tl.reshape(nibbles, (BLOCK_N, BLOCK_W * 8))  # k = 8 * word + nibble
    cols = tl.program_id(1) * BLOCK_W * 8 + tl.arange(0, BLOCK_W * 8)
    col_ok = (rows < N)[:, None] & (cols < WORDS * 8)[None, :]
    groups = cols // GROUP
    scale = tl.load(scales_ptr + rows[:, None] * stride_sn + groups[None, :], mask=col_ok,
                    other=0.0)
    zero = tl.load(zeros_ptr + rows[:, None] * stride_zn + groups[None, :], mask=col_ok, other=0)
    weight = (values.to(tl.float32) - zero.to(tl.float32)) * scale.to(tl.float32)
    tl.store(out_ptr + rows[:, None] * stride_on + cols[None, :],
             weight.to(out_ptr.dtype.element_ty), mask=col_ok)


def dequantize_w4(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                  group_size: int, dtype: torch.dtype) -> torch.Tensor:
    """W [N, K] in dtype from qweight int32 [N, K/8], scales [N, K/group], zeros uint8
    [N, K/group]: dequantize_int4's values, in one kernel."""
    num_n, words = qweight.shape
    out = torch.empty(num_n, words * 8, dtype=dtype, device=qweight.device)
    block_n, block_w = 32, 16
    grid = (triton.cdiv(num_n, block_n), triton.cdiv(words, block_w))
    _dequant_kernel[grid](qweight, scales, zeros, out, num_n, words, qweight.stride(0),
                          scales.stride(0), zeros.stride(0), out.stride(0), GROUP=group_size,
                          BLOCK_N=block_n, BLOCK_W=block_w)
    return out


def w4a16_dequant_mm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                     zeros: torch.Tensor, group_size: int) -> torch.Tensor:
    """x [T, K] @ dequant(W).T -> [T, N]: the weight dequantized to x's dtype, then torch.mm
    (a transient [N, K] buffer of the allocator's)."""
    return x @ dequantize_w4(qweight, scales, zeros, group_size, x.dtype).t()
