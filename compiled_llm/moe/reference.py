"""The torch reference of the fused MoE op: a loop over the experts that received tokens, each
one index_select, act(gate, up) (silu, swigluoai, gelu_tanh; optional per-expert biases), down
projection, routing weight and index_add into float32, experts in ascending order as HF's loop
adds them. Block-FP8 weights are dequantized per expert, activations quantized as the kernel
does. It reads per-expert counts on the host: right for the CPU, not for CUDA graphs."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

# (x [M, K]) -> (q [M, K], scale [M, K / group]): activation quantization per token and group
ActQuant = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
ACTIVATIONS = ("silu", "swigluoai", "gelu_tanh")


def check_activation(activation: str) -> None:
    """ValueError naming `activation` unless it is one of ACTIVATIONS."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"fused_moe: activation must be one of {ACTIVATIONS}, "
                         f"got {activation!r}")


class GatedActivation(NamedTuple):
    """The experts' act(gate, up): "silu": silu(gate) * up; "swigluoai" (GPT-OSS, vLLM's name):
    gate clamped above and up to [-limit, limit], then (up + 1) * gate * sigmoid(alpha * gate);
    "gelu_tanh" (Gemma 4): gelu(gate, approximate="tanh") * up."""

    name: str = "silu"
    alpha: float = 1.702
    limit: float = 7.0

    def __call__(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """act(gate, up) in the inputs' dtype."""
        if self.name == "silu":
            return F.silu(gate) * up
        if self.name == "gelu_tanh":
            return F.gelu(gate, approximate="tanh") * up
        gate = gate.clamp(max=self.limit)
        up = up.clamp(-self.limit, self.limit)
        return (up + 1) * gate * torch.sigmoid(self.alpha * gate)


SILU = GatedActivation()


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


def _gated(gate_up: torch.Tensor, bias: torch.Tensor | None,
           activation: GatedActivation) -> torch.Tensor:
    """act(gate, up) of one expert's rows: unbiased silu as ever in the GEMM's dtype; else the
    bias added and the activation taken in float32 (as the kernel's epilogue), then rounded."""
    if bias is None and activation.name == "silu":
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up
    full = gate_up.float() if bias is None else gate_up.float() + bias.float()
    gate, up = full.chunk(2, dim=-1)
    return activation(gate, up).to(gate_up.dtype)


def fused_moe_reference(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                        topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                        w13_scale: torch.Tensor | None = None,
                        w2_scale: torch.Tensor | None = None,
                        act_quant: ActQuant | None = None,
                        block: tuple[int, int] = (128, 128),
                        w13_bias: torch.Tensor | None = None,
                        w2_bias: torch.Tensor | None = None,
                        activation: GatedActivation = SILU) -> torch.Tensor:
    """hidden [T, H], w13 [E, 2I, H], w2 [E, H, I], topk_weights/ids [T, K] -> [T, H].
    An id equal to E names an expert held elsewhere (expert parallelism): it adds nothing.
    With w13_scale [E, 2I/b0, H/b1] and w2_scale [E, H/b0, I/b1] the weights are block
    quantized; act_quant, when given, quantizes both GEMMs' inputs (groups of block[1]).
    w13_bias [E, 2I] is added to the gate/up rows, w2_bias [E, H] to the down projection
    before the routing weight (GPT-OSS); activation picks act(gate, up)."""
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
        gate_up = F.linear(x.index_select(0, tokens), expert_w13)
        act = _gated(gate_up, None if w13_bias is None else w13_bias[expert], activation)
        if scaled:  # the kernel stores the activation in hidden's dtype, then quantizes it
            act = _activations(act.to(hidden.dtype), act_quant, block[1]).float()
        expert_out = F.linear(act, expert_w2).float()
        if w2_bias is not None:  # before the routing weight, as HF adds down_proj_bias
            expert_out = expert_out + w2_bias[expert].float()
        out.index_add_(0, tokens, expert_out * weights_of[rows, None])
    return out.to(hidden.dtype)
