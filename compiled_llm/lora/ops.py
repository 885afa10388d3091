"""The batched LoRA op `compiled_llm::lora_delta`: (x A_slot^T) B_slot^T per token by its slot
(-1: the base model, delta 0), for a group of sibling projections reading one input at once.
An op so a fullgraph trace with T dynamic holds it as one node (each sibling's call is the
same node once DuplicateOpEliminationPass has run); on CUDA the Triton shrink/expand,
elsewhere the torch reference."""

from __future__ import annotations

import math

import torch

LORA_OP_NAME = "compiled_llm::lora_delta"


def lora_delta_reference(x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                         token_slots: torch.Tensor, slice_ends: list[int]) -> torch.Tensor:
    """The torch reference: every slot's shrink at once, masked to each token's own slot, then
    one contraction over (slot, rank) per sibling. x [T, K], lora_a [S, G*R, K], lora_b
    [S, N, R] (scale folded in), token_slots [T], slice_ends [G] -> [T, N] in lora_b's dtype."""
    num_slots, ranks, num_k = lora_a.shape
    members = len(slice_ends)
    shrunk = x.to(lora_a.dtype) @ lora_a.reshape(num_slots * ranks, num_k).t()  # [T, S*G*R]
    column_slot = torch.arange(num_slots * ranks, device=x.device) // ranks
    own = (token_slots[:, None] == column_slot[None, :]).to(shrunk.dtype)
    shrunk = (shrunk * own).view(x.shape[0], num_slots, members, ranks // members)
    pieces, start = [], 0
    for member, end in enumerate(slice_ends):
        pieces.append(torch.einsum("tsr,snr->tn", shrunk[:, :, member], lora_b[:, start:end]))
        start = end
    return torch.cat(pieces, dim=1).to(lora_b.dtype)


def expand_block_n(slice_ends: list[int]) -> int:
    """The expand's column block: the largest of 64, 32, 16 dividing every sibling's width
    but the last (a block must not straddle two siblings); 0 if none does."""
    widths = [end - start for start, end in zip([0, *slice_ends[:-1]], slice_ends[:-1])]
    common = math.gcd(*widths) if widths else 64
    return next((block for block in (64, 32, 16) if common % block == 0), 0)


def step_views(step_meta: torch.Tensor, num_tokens: int, num_slots: int):
    """(token slots [T], rows sorted by slot [T], segment starts [S + 2], the base rows last)
    of the step buffer [slots (M) | sorted rows (M) | segment starts (S + 2)]."""
    size = (step_meta.shape[0] - num_slots - 2) // 2
    return (step_meta[:num_tokens], step_meta[size:size + num_tokens], step_meta[2 * size:])


@torch.library.custom_op(LORA_OP_NAME, mutates_args=())
def lora_delta(x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
               step_meta: torch.Tensor, slice_ends: list[int]) -> torch.Tensor:
    """Each token's adapter delta [T, N] for the siblings whose columns end at slice_ends.
    step_meta is the whole step buffer (layers.LoRAStepMeta), sliced here to T rows: the graph
    holds no slice of it."""
    token_slots, _, _ = step_views(step_meta, x.shape[0], lora_a.shape[0])
    return lora_delta_reference(x, lora_a, lora_b, token_slots, slice_ends)


@lora_delta.register_fake
def _lora_delta_fake(x, lora_a, lora_b, step_meta, slice_ends):
    return x.new_empty((x.shape[0], lora_b.shape[1]), dtype=lora_b.dtype)


@lora_delta.register_kernel("cuda")
def _lora_delta_cuda(x, lora_a, lora_b, step_meta, slice_ends):
    from compiled_llm.lora.kernels import lora_expand, lora_shrink

    _, sorted_tokens, seg_starts = step_views(step_meta, x.shape[0], lora_a.shape[0])
    x = x.to(lora_a.dtype).contiguous()
    shrunk = lora_shrink(x, lora_a, sorted_tokens, seg_starts, members=len(slice_ends))
    return lora_expand(shrunk, lora_b, sorted_tokens, seg_starts, list(slice_ends),
                       expand_block_n(list(slice_ends)))
