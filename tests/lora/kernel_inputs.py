"""Random inputs of the batched LoRA op: tokens spread over slots and the base model (-1),
and the slot-sorted order and segment starts the kernels read."""

from __future__ import annotations

import torch


def lora_inputs(tokens: int, slots: int, rank: int, k: int, n: int, dtype=torch.float32,
                seed: int = 0, device: str = "cpu"):
    """(x [T, K], y [T, N], lora_a [S, R, K], lora_b [S, N, R], token_slots [T] in [-1, S))."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return (torch.randn(*shape, generator=gen) * 0.5).to(dtype).to(device)

    token_slots = torch.randint(-1, slots, (tokens,), generator=gen).to(device)
    return rand(tokens, k), rand(tokens, n), rand(slots, rank, k), rand(slots, n, rank), token_slots


def segments(token_slots: torch.Tensor, slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(adapter tokens sorted by slot, padded with -1 to T; segment starts [S + 1])."""
    order = torch.argsort(token_slots, stable=True)
    order = order[token_slots[order] >= 0]
    counts = torch.bincount(token_slots[token_slots >= 0], minlength=slots)
    starts = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    padded = torch.full_like(token_slots, -1)
    padded[:len(order)] = order
    return padded, starts
