"""moe_align_block_size: the (token, slot) entries of a top-k routing sorted by expert, each
expert's run padded to a multiple of block_m, so that every block of block_m rows of the grouped
GEMM reads one expert. Torch ops of static shapes only: no host sync, CUDA-graph capturable.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class AlignedRouting(NamedTuple):
    """Entries grouped by expert: sorted_ids [max_padded] int32 holds flat (token * K + slot)
    indices, padded with num_entries (T * K, read as 'no row'); expert_ids [max_padded/block_m]
    int32 is each block's expert; num_post_padded [1] int32 counts the rows in use (on device)."""

    sorted_ids: torch.Tensor
    expert_ids: torch.Tensor
    num_post_padded: torch.Tensor
    num_entries: int
    block_m: int


def max_padded_rows(num_entries: int, num_experts: int, block_m: int) -> int:
    """An upper bound of the padded rows from shapes alone: each expert that gets entries adds
    at most block_m - 1 pad rows, and at most min(E, entries) experts get any."""
    rows = num_entries + min(num_experts, num_entries) * (block_m - 1)
    return -(-rows // block_m) * block_m


def moe_align_block_size(topk_ids: torch.Tensor, block_m: int,
                         num_experts: int) -> AlignedRouting:
    """Sort topk_ids [T, K] by expert (stable: token order within an expert) and pad each
    expert's run to block_m rows; experts in ascending order."""
    flat = topk_ids.flatten().long()
    num_entries, device = flat.numel(), flat.device
    counts = torch.zeros(num_experts, dtype=torch.long, device=device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # bincount would sync for its size
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)
    experts_in_order = flat[order]
    first_entry = torch.cumsum(counts, 0) - counts  # of each expert, unpadded
    rank = torch.arange(num_entries, device=device) - first_entry[experts_in_order]
    dest = padded_end[experts_in_order] - padded[experts_in_order] + rank
    rows = max_padded_rows(num_entries, num_experts, block_m)
    sorted_ids = torch.full((rows,), num_entries, dtype=torch.int32, device=device)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    block_starts = torch.arange(0, rows, block_m, device=device)
    expert_ids = torch.searchsorted(padded_end, block_starts, right=True)
    expert_ids = expert_ids.clamp_(max=num_experts - 1).to(torch.int32)
    num_post_padded = padded_end[-1:].to(torch.int32)
    return AlignedRouting(sorted_ids, expert_ids, num_post_padded, num_entries, block_m)
