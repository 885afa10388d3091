"""Segmented LoRA shrink and expand. Every row is in `sorted_tokens`, grouped by slot (slot s:
seg_starts[s]:seg_starts[s+1]; the base-model rows, padding included, last); a program takes
BLOCK_M rows of one segment, so an adapter's A and B tiles are read once per block. The expand
writes every output row (base rows copied), so y is never copied first. Grids depend on the
token and slot counts only (no host read of the segments: CUDA graphs replay them)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _segment_block(sorted_ptr, seg_ptr, slot, block, BLOCK_M: tl.constexpr):
    """(is the block non-empty, its tokens, which rows are in the segment) for block `block`
    of slot `slot`'s segment."""
    start = tl.load(seg_ptr + slot)
    end = tl.load(seg_ptr + slot + 1)
    rows = start + block * BLOCK_M + tl.arange(0, BLOCK_M)
    in_seg = rows < end
    tokens = tl.load(sorted_ptr + rows, mask=in_seg, other=0)
    return start + block * BLOCK_M < end, tokens, in_seg


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, h_ptr, sorted_ptr, seg_ptr, K, stride_x, stride_as,
                   stride_ar, stride_h, RANK: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, PRECISION: tl.constexpr):
    slot, block, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    busy, tokens, in_seg = _segment_block(sorted_ptr, seg_ptr, slot, block, BLOCK_M)
    if busy:
        ranks = tl.arange(0, RANK)
        acc = tl.zeros((BLOCK_M, RANK), dtype=tl.float32)
        for k0 in range(split * BLOCK_K, K, BLOCK_K * SPLIT_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            in_k = cols < K
            x = tl.load(x_ptr + tokens[:, None] * stride_x + cols[None, :],
                        mask=in_seg[:, None] & in_k[None, :], other=0.0)
            a = tl.load(a_ptr + slot * stride_as + ranks[None, :] * stride_ar + cols[:, None],
                        mask=in_k[:, None], other=0.0)
            acc += tl.dot(x, a, input_precision=PRECISION)
        out = h_ptr + tokens[:, None] * stride_h + ranks[None, :]
        tl.atomic_add(out, acc, mask=in_seg[:, None])


@triton.jit
def _expand_kernel(y_ptr, h_ptr, b_ptr, out_ptr, sorted_ptr, seg_ptr, N, NUM_SLOTS, stride_y,
                   stride_h, stride_bs, stride_bn, stride_out, RANK: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    slot, block, nblock = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    busy, tokens, in_seg = _segment_block(sorted_ptr, seg_ptr, slot, block, BLOCK_M)
    if busy:
        cols = nblock * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = in_seg[:, None] & (cols < N)[None, :]
        y = tl.load(y_ptr + tokens[:, None] * stride_y + cols[None, :], mask=mask, other=0.0)
        out = out_ptr + tokens[:, None] * stride_out + cols[None, :]
        if slot == NUM_SLOTS:  # the base-model rows
            tl.store(out, y, mask=mask)
        else:
            ranks = tl.arange(0, RANK)
            h = tl.load(h_ptr + tokens[:, None] * stride_h + ranks[None, :],
                        mask=in_seg[:, None], other=0.0)
            b = tl.load(b_ptr + slot * stride_bs + cols[None, :] * stride_bn + ranks[:, None],
                        mask=(cols < N)[None, :], other=0.0)
            delta = tl.dot(h.to(b.dtype), b, input_precision=PRECISION)
            tl.store(out, (y.to(tl.float32) + delta).to(out.dtype.element_ty), mask=mask)


def _precision(dtype: torch.dtype) -> str:
    # float32 models get float32 products (as torch's matmuls do by default), not TF32
    return "ieee" if dtype == torch.float32 else "tf32"


def _block_m(num_tokens: int) -> int:
    return 16 if num_tokens <= 256 else 64


def lora_shrink(x: torch.Tensor, lora_a: torch.Tensor, sorted_tokens: torch.Tensor,
                seg_starts: torch.Tensor, block_k: int = 64, split_k: int = 0) -> torch.Tensor:
    """h [T, R] float32 = x[t] @ lora_a[slot(t)]^T for the adapter rows (the base rows 0).
    x [T, K] (rows contiguous), lora_a [S, R, K], sorted_tokens [T], seg_starts [S + 2];
    split_k 0 picks one from the token count."""
    num_tokens, num_k = x.shape
    num_slots, rank, _ = lora_a.shape
    h = torch.zeros(num_tokens, rank, dtype=torch.float32, device=x.device)
    if num_tokens == 0:
        return h
    block_m = _block_m(num_tokens)
    # few tokens leave most of the device idle: split K over more programs
    split_k = split_k or (8 if num_tokens <= 64 else 2)
    grid = (num_slots, triton.cdiv(num_tokens, block_m), split_k)
    _shrink_kernel[grid](x, lora_a, h, sorted_tokens, seg_starts, num_k, x.stride(0),
                         lora_a.stride(0), lora_a.stride(1), h.stride(0), RANK=rank,
                         BLOCK_M=block_m, BLOCK_K=block_k, SPLIT_K=split_k,
                         PRECISION=_precision(x.dtype))
    return h


def lora_expand(y: torch.Tensor, h: torch.Tensor, lora_b: torch.Tensor,
                sorted_tokens: torch.Tensor, seg_starts: torch.Tensor,
                block_n: int = 64) -> torch.Tensor:
    """y + h[t] @ lora_b[slot(t)]^T for the adapter rows, y for the base rows: a new tensor,
    every row of it written (the segments cover all T rows). y [T, N], h [T, R],
    lora_b [S, N, R]."""
    out = torch.empty_like(y)
    num_tokens, num_n = y.shape
    if num_tokens == 0:
        return out
    num_slots, _, rank = lora_b.shape
    block_m = _block_m(num_tokens)
    grid = (num_slots + 1, triton.cdiv(num_tokens, block_m), triton.cdiv(num_n, block_n))
    _expand_kernel[grid](y, h, lora_b, out, sorted_tokens, seg_starts, num_n, num_slots,
                         y.stride(0), h.stride(0), lora_b.stride(0), lora_b.stride(1),
                         out.stride(0), RANK=rank, BLOCK_M=block_m, BLOCK_N=block_n,
                         PRECISION=_precision(y.dtype))
    return out


def kernels_interpreted() -> bool:
    """True when Triton's interpreter runs these kernels (TRITON_INTERPRET=1 at import)."""
    from triton.runtime.jit import JITFunction

    return not isinstance(_shrink_kernel, JITFunction)
