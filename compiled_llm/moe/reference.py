"""The torch reference of the fused MoE op: a loop over the experts that received tokens, each
one index_select, silu(gate) * up, down projection, routing weight and index_add into float32,
experts in ascending order as HF's loop adds them (float32 results agree with transformers).
It reads per-expert counts on the host: right for the CPU, not for CUDA graphs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def fused_moe_reference(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                        topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """hidden [T, H], w13 [E, 2I, H], w2 [E, H, I], topk_weights/ids [T, K] -> [T, H]."""
    num_tokens, top_k = topk_ids.shape
    out = torch.zeros(num_tokens, hidden.shape[1], dtype=torch.float32, device=hidden.device)
    flat_ids = topk_ids.flatten()
    order = torch.argsort(flat_ids, stable=True)  # the (token, slot) entries grouped by expert
    counts = torch.bincount(flat_ids, minlength=w13.shape[0]).tolist()
    tokens_of = order // top_k
    weights_of = topk_weights.flatten()[order].float()
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        rows = slice(start, start + count)
        start += count
        tokens = tokens_of[rows]
        gate, up = F.linear(hidden.index_select(0, tokens), w13[expert]).chunk(2, dim=-1)
        expert_out = F.linear(F.silu(gate) * up, w2[expert])
        out.index_add_(0, tokens, expert_out.float() * weights_of[rows, None])
    return out.to(hidden.dtype)
