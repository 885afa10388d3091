"""The torch reference of the fused MoE op: a loop over the experts that received tokens, each
one index_select, silu(gate) * up, down projection, routing weight and index_add into float32,
experts in ascending order as HF's loop adds them (float32 results agree with transformers).
Block-FP8 weights are dequantized per expert, activations quantized as the kernel does. It reads
per-expert counts on the host: right for the CPU, not for CUDA graphs."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

# (x [M, K]) -> (q [M, K], scale [M, K / group]): activation quantization per token and group
ActQuant = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def block_dequant(values: torch.Tensor, scale: torch.Tensor,
                  block: tuple[int, int]) -> torch.Tensor:
    """values [R, C] times scale [ceil(R / block[0]), ceil(C / block[1])] blockwise, float32."""
    full = scale.float().repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
    return values.float() * full[: values.shape[0], : values.shape[1]]


class _Experts:
    """Expert e's [W_gate; W_up] and W_down as float matrices (dequantized when scaled)."""

    def __init__(self, w13, w2, w13_scale, w2_scale, block) -> None:
        self.w13, self.w2, self.w13_scale, self.w2_scale = w13, w2, w13_scale, w2_scale
        self.block = block

    def get(self, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(w13[expert], w2[expert]), dequantized to float32 when block scaled."""
        if self.w13_scale is None:
            return self.w13[expert], self.w2[expert]
        return (block_dequant(self.w13[expert], self.w13_scale[expert], self.block),
                block_dequant(self.w2[expert], self.w2_scale[expert], self.block))


def _activations(x: torch.Tensor, act_quant: ActQuant | None, group: int) -> torch.Tensor:
    if act_quant is None:
        return x
    q, scale = act_quant(x)
    return block_dequant(q, scale, (1, group))


def fused_moe_reference(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                        topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                        w13_scale: torch.Tensor | None = None,
                        w2_scale: torch.Tensor | None = None,
                        act_quant: ActQuant | None = None,
                        block: tuple[int, int] = (128, 128)) -> torch.Tensor:
    """hidden [T, H], w13 [E, 2I, H], w2 [E, H, I], topk_weights/ids [T, K] -> [T, H].
    An id equal to E names an expert held elsewhere (expert parallelism): it adds nothing.
    With w13_scale [E, 2I/b0, H/b1] and w2_scale [E, H/b0, I/b1] the weights are block
    quantized; act_quant, when given, quantizes both GEMMs' inputs (groups of block[1])."""
    num_tokens, top_k = topk_ids.shape
    num_experts = w13.shape[0]
    out = torch.zeros(num_tokens, hidden.shape[1], dtype=torch.float32, device=hidden.device)
    experts = _Experts(w13, w2, w13_scale, w2_scale, block)
    scaled = w13_scale is not None
    x = _activations(hidden, act_quant, block[1]).float() if scaled else hidden
    flat_ids = topk_ids.flatten()
    order = torch.argsort(flat_ids, stable=True)  # the (token, slot) entries grouped by expert
    counts = torch.bincount(flat_ids, minlength=num_experts + 1)[:num_experts].tolist()
    tokens_of = order // top_k
    weights_of = topk_weights.flatten()[order].float()
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        rows = slice(start, start + count)
        start += count
        tokens = tokens_of[rows]
        expert_w13, expert_w2 = experts.get(expert)
        gate, up = F.linear(x.index_select(0, tokens), expert_w13).chunk(2, dim=-1)
        act = F.silu(gate) * up
        if scaled:  # the kernel stores the activation in hidden's dtype, then quantizes it
            act = _activations(act.to(hidden.dtype), act_quant, block[1]).float()
        expert_out = F.linear(act, expert_w2)
        out.index_add_(0, tokens, expert_out.float() * weights_of[rows, None])
    return out.to(hidden.dtype)
