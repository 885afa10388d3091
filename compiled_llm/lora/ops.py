"""The batched LoRA op `compiled_llm::lora_add`: y + scale * (x A_slot^T) B_slot^T per token by
its slot (-1: the base model, y unchanged). An op so a fullgraph trace with T dynamic holds it
as one node; on CUDA the Triton shrink/expand, elsewhere the torch reference."""

from __future__ import annotations

import torch

LORA_OP_NAME = "compiled_llm::lora_add"


def lora_add_reference(x: torch.Tensor, y: torch.Tensor, lora_a: torch.Tensor,
                       lora_b: torch.Tensor, token_slots: torch.Tensor) -> torch.Tensor:
    """The torch reference: every slot's shrink at once, masked to each token's own slot, then
    one contraction over (slot, rank). x [T, K], y [T, N], lora_a [S, R, K], lora_b [S, N, R]
    (scale folded in), token_slots [T]."""
    num_slots, rank, num_k = lora_a.shape
    shrunk = x @ lora_a.reshape(num_slots * rank, num_k).t()  # [T, S*R]
    column_slot = torch.arange(num_slots * rank, device=x.device) // rank
    own = (token_slots[:, None] == column_slot[None, :]).to(shrunk.dtype)
    shrunk = (shrunk * own).view(-1, num_slots, rank)
    return y + torch.einsum("tsr,snr->tn", shrunk, lora_b).to(y.dtype)


def step_views(step_meta: torch.Tensor, num_tokens: int, num_slots: int):
    """(token slots [T], rows sorted by slot [T], segment starts [S + 2], the base rows last)
    of the step buffer [slots (M) | sorted rows (M) | segment starts (S + 2)]."""
    size = (step_meta.shape[0] - num_slots - 2) // 2
    return (step_meta[:num_tokens], step_meta[size:size + num_tokens], step_meta[2 * size:])


@torch.library.custom_op(LORA_OP_NAME, mutates_args=())
def lora_add(x: torch.Tensor, y: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
             step_meta: torch.Tensor) -> torch.Tensor:
    """y [T, N] plus each token's adapter delta, a new tensor. step_meta is the whole step
    buffer (layers.LoRAStepMeta), sliced here to T rows: the graph holds no slice of it."""
    token_slots, _, _ = step_views(step_meta, x.shape[0], lora_a.shape[0])
    return lora_add_reference(x, y, lora_a, lora_b, token_slots)


@lora_add.register_fake
def _lora_add_fake(x, y, lora_a, lora_b, step_meta):
    return torch.empty_like(y)


@lora_add.register_kernel("cuda")
def _lora_add_cuda(x, y, lora_a, lora_b, step_meta):
    from compiled_llm.lora.kernels import lora_expand, lora_shrink

    _, sorted_tokens, seg_starts = step_views(step_meta, x.shape[0], lora_a.shape[0])
    shrunk = lora_shrink(x.contiguous(), lora_a, sorted_tokens, seg_starts)
    return lora_expand(y, shrunk, lora_b, sorted_tokens, seg_starts)
