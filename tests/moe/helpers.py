"""Random MoE inputs and a per-token loop that spells the fused MoE op's contract directly."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def moe_inputs(num_tokens: int, num_experts: int, top_k: int, hidden: int, inter: int,
               dtype: torch.dtype = torch.float32, seed: int = 0):
    """(hidden, w13, w2, topk_weights, topk_ids) with softmax top-k routing of random logits."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, hidden, generator=gen).to(dtype)
    w13 = (torch.randn(num_experts, 2 * inter, hidden, generator=gen) * 0.2).to(dtype)
    w2 = (torch.randn(num_experts, hidden, inter, generator=gen) * 0.2).to(dtype)
    logits = torch.randn(num_tokens, num_experts, generator=gen)
    weights, ids = torch.softmax(logits, -1).topk(top_k, -1)
    return x, w13, w2, weights, ids


def per_token_moe(x, w13, w2, weights, ids) -> torch.Tensor:
    """sum_k weight * expert(x) one token and one slot at a time, in float64."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for token in range(x.shape[0]):
        for slot in range(ids.shape[1]):
            expert = int(ids[token, slot])
            gate, up = (w13[expert].double() @ x[token].double()).chunk(2)
            out[token] += float(weights[token, slot]) * (w2[expert].double() @ (F.silu(gate) * up))
    return out
