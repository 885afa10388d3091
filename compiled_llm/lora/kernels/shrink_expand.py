"""Segmented LoRA shrink/expand for a group of sibling projections (q/k/v: one input, A rows
stacked, B rows in column order), rows grouped by slot (seg_starts; the base rows last), BLOCK_M
rows of one segment a program. The shrink writes an fp32 partial per K split (no zero fill, no
atomics); the expand sums them and writes every row's delta (0 for the base rows). Grids depend
on the token and slot counts only: CUDA graphs replay them."""

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
                   stride_ar, stride_hs, stride_h, RANK: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, PRECISION: tl.constexpr):
    slot, block, work = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    member, split = work // SPLIT_K, work % SPLIT_K  # which sibling's ranks, which K split
    busy, tokens, in_seg = _segment_block(sorted_ptr, seg_ptr, slot, block, BLOCK_M)
    if busy:
        ranks = member * RANK + tl.arange(0, RANK)
        acc = tl.zeros((BLOCK_M, RANK), dtype=tl.float32)
        for k0 in range(split * BLOCK_K, K, BLOCK_K * SPLIT_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            in_k = cols < K
            x = tl.load(x_ptr + tokens[:, None] * stride_x + cols[None, :],
                        mask=in_seg[:, None] & in_k[None, :], other=0.0)
            a = tl.load(a_ptr + slot * stride_as + ranks[None, :] * stride_ar + cols[:, None],
                        mask=in_k[:, None], other=0.0)
            acc += tl.dot(x, a, input_precision=PRECISION)
        out = h_ptr + split * stride_hs + tokens[:, None] * stride_h + ranks[None, :]
        tl.store(out, acc, mask=in_seg[:, None])


@triton.jit
def _expand_kernel(h_ptr, b_ptr, out_ptr, sorted_ptr, seg_ptr, N, END0, END1, NUM_SLOTS,
                   stride_hs, stride_h, stride_bs, stride_bn, stride_out, RANK: tl.constexpr,
                   SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   PRECISION: tl.constexpr):
    slot, block, nblock = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    busy, tokens, in_seg = _segment_block(sorted_ptr, seg_ptr, slot, block, BLOCK_M)
    if busy:
        cols = nblock * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        mask = in_seg[:, None] & col_ok[None, :]
        out = out_ptr + tokens[:, None] * stride_out + cols[None, :]
        if slot == NUM_SLOTS:  # the base-model rows
            tl.store(out, tl.zeros((BLOCK_M, BLOCK_N), dtype=out_ptr.dtype.element_ty),
                     mask=mask)
        else:
            # a block lies in one sibling's columns (BLOCK_N divides every sibling's width)
            col0 = nblock * BLOCK_N
            member = (col0 >= END0).to(tl.int32) + (col0 >= END1).to(tl.int32)
            ranks = member * RANK + tl.arange(0, RANK)
            h = tl.zeros((BLOCK_M, RANK), dtype=tl.float32)
            for split in range(SPLIT_K):
                h += tl.load(h_ptr + split * stride_hs + tokens[:, None] * stride_h
                             + ranks[None, :], mask=in_seg[:, None], other=0.0)
            b = tl.load(b_ptr + slot * stride_bs + cols[None, :] * stride_bn
                        + tl.arange(0, RANK)[:, None], mask=col_ok[None, :], other=0.0)
            delta = tl.dot(h.to(b.dtype), b, input_precision=PRECISION)
            tl.store(out, delta.to(out_ptr.dtype.element_ty), mask=mask)


def _precision(dtype: torch.dtype) -> str:
    # float32 models get float32 products (as torch's matmuls do by default), not TF32
    return "ieee" if dtype == torch.float32 else "tf32"


def _block_m(num_tokens: int) -> int:
    return 16 if num_tokens <= 256 else 64


def lora_shrink(x: torch.Tensor, lora_a: torch.Tensor, sorted_tokens: torch.Tensor,
                seg_starts: torch.Tensor, members: int = 1, block_k: int = 64,
                split_k: int = 0) -> torch.Tensor:
    """h [SPLIT, T, G*R] float32: split partials of x[t] @ lora_a[slot(t)]^T, written for the
    adapter rows only (the base rows are left unset: the expand never reads them).
    x [T, K] (rows contiguous), lora_a [S, G*R, K] (G = members), sorted_tokens [T],
    seg_starts [S + 2]; split_k 0 picks one from the token count."""
    num_tokens, num_k = x.shape
    num_slots, ranks, _ = lora_a.shape
    # few tokens leave most of the device idle: split K over more programs
    split_k = split_k or (8 if num_tokens <= 64 else 2)
    h = torch.empty(split_k, num_tokens, ranks, dtype=torch.float32, device=x.device)
    if num_tokens == 0:
        return h
    block_m = _block_m(num_tokens)
    grid = (num_slots, triton.cdiv(num_tokens, block_m), members * split_k)
    _shrink_kernel[grid](x, lora_a, h, sorted_tokens, seg_starts, num_k, x.stride(0),
                         lora_a.stride(0), lora_a.stride(1), h.stride(0), h.stride(1),
                         RANK=ranks // members, BLOCK_M=block_m, BLOCK_K=block_k,
                         SPLIT_K=split_k, PRECISION=_precision(x.dtype))
    return h


def lora_expand(h: torch.Tensor, lora_b: torch.Tensor, sorted_tokens: torch.Tensor,
                seg_starts: torch.Tensor, slice_ends: list[int], block_n: int) -> torch.Tensor:
    """delta [T, N] in lora_b's dtype: sum of h's splits [:, t, member ranks] @
    lora_b[slot(t)]^T for the adapter rows, 0 for the base rows; every row written.
    h from lora_shrink, lora_b [S, N, R], slice_ends the siblings' cumulative widths (<= 3),
    block_n dividing every sibling's width but the last (ops.expand_block_n)."""
    split_k, num_tokens, _ = h.shape
    num_slots, num_n, rank = lora_b.shape
    out = torch.empty(num_tokens, num_n, dtype=lora_b.dtype, device=lora_b.device)
    if num_tokens == 0:
        return out
    ends = [*slice_ends[:-1], num_n, num_n][:2]
    block_m = _block_m(num_tokens)
    grid = (num_slots + 1, triton.cdiv(num_tokens, block_m), triton.cdiv(num_n, block_n))
    _expand_kernel[grid](h, lora_b, out, sorted_tokens, seg_starts, num_n, ends[0], ends[1],
                         num_slots, h.stride(0), h.stride(1), lora_b.stride(0),
                         lora_b.stride(1), out.stride(0), RANK=rank, SPLIT_K=split_k,
                         BLOCK_M=block_m, BLOCK_N=block_n, PRECISION=_precision(lora_b.dtype))
    return out


def kernels_interpreted() -> bool:
    """True when Triton's interpreter runs these kernels (TRITON_INTERPRET=1 at import)."""
    from triton.runtime.jit import JITFunction

    return not isinstance(_shrink_kernel, JITFunction)
