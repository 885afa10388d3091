"""The expert-dispatch custom op of mixture-of-experts models: `compiled_llm::fused_moe`.

On CPU it runs the torch reference (reference.py); on CUDA a Triton grouped GEMM over tokens
sorted and padded by expert (triton_moe.py, kernels/) that never waits on the host.
"""

from __future__ import annotations

import torch

from compiled_llm.moe.reference import fused_moe_reference

__all__ = ["FUSED_MOE_OP_NAME", "fused_moe", "fused_moe_reference"]

FUSED_MOE_OP_NAME = "compiled_llm::fused_moe"


def check_moe_shapes(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                     topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> None:
    """ValueError unless the op's inputs agree: hidden [T, H], w13 [E, 2I, H], w2 [E, H, I],
    topk_weights and topk_ids [T, K] (ids an integer dtype)."""
    num_experts, double_inter, hidden_size = w13.shape
    if (hidden.dim() != 2 or hidden.shape[1] != hidden_size or double_inter % 2
            or tuple(w2.shape) != (num_experts, hidden_size, double_inter // 2)):
        raise ValueError(f"fused_moe: hidden {tuple(hidden.shape)}, w13 {tuple(w13.shape)} and "
                         f"w2 {tuple(w2.shape)} do not fit [T, H], [E, 2I, H], [E, H, I]")
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != hidden.shape[0]:
        raise ValueError(f"fused_moe: topk_ids {tuple(topk_ids.shape)} and topk_weights "
                         f"{tuple(topk_weights.shape)} must both be [T, K] for T={hidden.shape[0]}")
    if topk_ids.dtype.is_floating_point:
        raise ValueError(f"fused_moe: topk_ids must be integers, got {topk_ids.dtype}")


@torch.library.custom_op(FUSED_MOE_OP_NAME, mutates_args=())
def fused_moe(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(hidden[t]) -> [T, H] in hidden's dtype,
    expert_e(x) = (silu(x W_gate^T) * x W_up^T) W_down^T with w13[e] = [W_gate; W_up].

    An op, not a pattern pass: the dispatch is a data-dependent loop (which tokens reach which
    expert, and how many) that a fullgraph trace with a dynamic token count cannot hold without
    graph breaks or host syncs. At its boundary it is shape-static ([T, H] in and out), so the
    graph is not split at it: Inductor calls it inside a piece, CUDA graphs capture it with the
    piece, and the routing before it (plain torch in the model) is fused by Inductor.

    Parallelism: every size comes from the weights, so a tensor-parallel transform can shard
    each expert's intermediate dim (w13 [E, 2I/tp, H] holding each rank's gate and up rows,
    w2 [E, H, I/tp]) and all-reduce the output; expert parallelism (whole experts per rank) is
    to add a global-to-local expert map argument (-1: not on this rank).
    """
    check_moe_shapes(hidden, w13, w2, topk_weights, topk_ids)
    return fused_moe_reference(hidden, w13, w2, topk_weights, topk_ids)


@fused_moe.register_fake
def _fused_moe_fake(hidden, w13, w2, topk_weights, topk_ids):
    return torch.empty_like(hidden)


@fused_moe.register_kernel("cuda")
def _fused_moe_cuda(hidden, w13, w2, topk_weights, topk_ids):
    from compiled_llm.moe.triton_moe import fused_moe_triton  # Triton loads on first use

    check_moe_shapes(hidden, w13, w2, topk_weights, topk_ids)
    return fused_moe_triton(hidden, w13, w2, topk_weights, topk_ids)
