"""Random inputs of the batched LoRA op: tokens spread over slots and the base model (-1),
and the slot-sorted order and segment starts the kernels read."""

from __future__ import annotations

import torch


def lora_inputs(tokens: int, slots: int, rank: int, k: int, widths: list[int],
                dtype=torch.float32, seed: int = 0, device: str = "cpu"):
    """(x [T, K], lora_a [S, G*R, K], lora_b [S, N, R], token_slots [T] in [-1, S),
    slice_ends [G]) for G siblings of these output widths."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return (torch.randn(*shape, generator=gen) * 0.5).to(dtype).to(device)

    token_slots = torch.randint(-1, slots, (tokens,), generator=gen).to(device)
    slice_ends = [sum(widths[:j + 1]) for j in range(len(widths))]
    return (rand(tokens, k), rand(slots, rank * len(widths), k), rand(slots, slice_ends[-1], rank),
            token_slots, slice_ends)


def segments(token_slots: torch.Tensor, slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows grouped by slot, the base rows last; segment starts [S + 2]), as the slot pool
    fills them each step."""
    from compiled_llm.lora.manager import group_rows

    order, starts = group_rows(token_slots.cpu().numpy(), slots)
    return (torch.from_numpy(order).to(token_slots.device),
            torch.from_numpy(starts).to(token_slots.device))


def step_meta(token_slots: torch.Tensor, slots: int, max_tokens: int) -> torch.Tensor:
    """The step buffer (layers.LoRAStepMeta) of a step of these token slots."""
    order, starts = segments(token_slots, slots)
    meta = torch.full((2 * max_tokens + slots + 2,), -1, dtype=torch.int64,
                      device=token_slots.device)
    meta[:len(token_slots)] = token_slots
    meta[max_tokens:max_tokens + len(token_slots)] = order
    meta[2 * max_tokens:] = starts
    return meta
