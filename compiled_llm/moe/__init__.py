"""The expert-dispatch custom op of mixture-of-experts models: `compiled_llm::fused_moe`.

On CPU it runs the torch reference (reference.py); on CUDA a Triton grouped GEMM over tokens
sorted and padded by expert (triton_moe.py, kernels/) that never waits on the host. Optional
trailing arguments: per-expert biases, the activation (silu, swigluoai, gelu_tanh).
"""

from __future__ import annotations

import torch

from compiled_llm.moe.reference import (
    ACTIVATIONS,
    GatedActivation,
    check_activation,
    fused_moe_reference,
)

__all__ = ["ACTIVATIONS", "FUSED_MOE_OP_NAME", "GatedActivation", "check_activation",
           "check_moe_shapes", "epilogue_kwargs", "fused_moe", "fused_moe_reference"]

FUSED_MOE_OP_NAME = "compiled_llm::fused_moe"


def check_moe_shapes(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                     topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                     w13_bias: torch.Tensor | None = None,
                     w2_bias: torch.Tensor | None = None) -> None:
    """ValueError unless the op's inputs agree: hidden [T, H], w13 [E, 2I, H], w2 [E, H, I],
    topk_weights and topk_ids [T, K] (ids an integer dtype), w13_bias [E, 2I], w2_bias [E, H]."""
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
    for name, bias, shape in (("w13_bias", w13_bias, w13.shape[:2]),
                              ("w2_bias", w2_bias, w2.shape[:2])):
        if bias is not None and bias.shape != shape:
            raise ValueError(f"fused_moe: {name} {tuple(bias.shape)} must be {tuple(shape)} "
                             "(one bias row per expert: [E, 2I] for w13, [E, H] for w2)")


def epilogue_kwargs(w13_bias: torch.Tensor | None, w2_bias: torch.Tensor | None,
                    activation: str, swiglu_alpha: float, swiglu_limit: float) -> dict:
    """The reference's and the Triton path's keyword arguments for the op's trailing ones;
    none for unbiased silu, so that wrappers of the five-argument form keep working."""
    check_activation(activation)
    if w13_bias is None and w2_bias is None and activation == "silu":
        return {}
    return {"w13_bias": w13_bias, "w2_bias": w2_bias,
            "activation": GatedActivation(activation, swiglu_alpha, swiglu_limit)}


@torch.library.custom_op(FUSED_MOE_OP_NAME, mutates_args=())
def fused_moe(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              topk_weights: torch.Tensor, topk_ids: torch.Tensor,
              w13_bias: torch.Tensor | None = None, w2_bias: torch.Tensor | None = None,
              activation: str = "silu", swiglu_alpha: float = 1.702,
              swiglu_limit: float = 7.0) -> torch.Tensor:
    """sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(hidden[t]) -> [T, H] in hidden's dtype,
    expert_e(x) = act(x W_gate^T + b_gate, x W_up^T + b_up) W_down^T + b_down with
    w13[e] = [W_gate; W_up], w13_bias[e] = [b_gate; b_up], w2_bias[e] = b_down (biases
    optional, zero when None); act: "silu" silu(gate) * up, "gelu_tanh" gelu_tanh(gate) * up
    (Gemma 4), or "swigluoai" (GPT-OSS) with swiglu_alpha and swiglu_limit (GatedActivation).
    The trailing arguments default to the plain SiLU experts, so callers and stored graphs of
    the five-argument form stay valid.

    An op, not a pattern pass: the dispatch is a data-dependent loop (which tokens reach which
    expert, and how many) that a fullgraph trace with a dynamic token count cannot hold without
    graph breaks or host syncs. At its boundary it is shape-static ([T, H] in and out), so the
    graph is not split at it: Inductor calls it inside a piece, CUDA graphs capture it with the
    piece, and the routing before it (plain torch in the model) is fused by Inductor.

    Parallelism: every size comes from the weights, so a tensor-parallel transform can shard
    each expert's intermediate dim (w13 [E, 2I/tp, H] holding each rank's gate and up rows,
    w2 [E, H, I/tp], w2_bias on one rank only) and all-reduce the output; expert parallelism
    (whole experts per rank) is to add a global-to-local expert map argument (-1: not on this
    rank).
    """
    extras = epilogue_kwargs(w13_bias, w2_bias, activation, swiglu_alpha, swiglu_limit)
    check_moe_shapes(hidden, w13, w2, topk_weights, topk_ids, w13_bias, w2_bias)
    return fused_moe_reference(hidden, w13, w2, topk_weights, topk_ids, **extras)


@fused_moe.register_fake
def _fused_moe_fake(hidden, w13, w2, topk_weights, topk_ids, w13_bias=None, w2_bias=None,
                    activation="silu", swiglu_alpha=1.702, swiglu_limit=7.0):
    check_activation(activation)
    return torch.empty_like(hidden)


@fused_moe.register_kernel("cuda")
def _fused_moe_cuda(hidden, w13, w2, topk_weights, topk_ids, w13_bias=None, w2_bias=None,
                    activation="silu", swiglu_alpha=1.702, swiglu_limit=7.0):
    from compiled_llm.moe.triton_moe import fused_moe_triton  # Triton loads on first use

    extras = epilogue_kwargs(w13_bias, w2_bias, activation, swiglu_alpha, swiglu_limit)
    check_moe_shapes(hidden, w13, w2, topk_weights, topk_ids, w13_bias, w2_bias)
    return fused_moe_triton(hidden, w13, w2, topk_weights, topk_ids, **extras)
