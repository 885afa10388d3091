"""Shared mixture-of-experts blocks: the stacked routed experts, the sparse MoE block (router,
softmax top-k, experts, optional sigmoid-gated shared expert) and the load-time map of per-expert
checkpoint tensors into the stacked parameters. All plain torch but the expert dispatch, which is
one op (`compiled_llm::fused_moe`; compiled_llm/moe says why); experts may carry per-expert biases
and GPT-OSS's swigluoai activation.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from compiled_llm.models.config import DecoderConfig, MoeConfig
from compiled_llm.models.layers import GatedMLP
from compiled_llm.models.moe_routing import softmax_topk
from compiled_llm.moe import check_activation, fused_moe


class ExpertWeight(NamedTuple):
    """Where one per-expert checkpoint tensor goes: part `shard` of `num_shards` (split along
    dim 0) of row `expert` of the stacked parameter `name`."""

    name: str
    expert: int
    shard: int = 0
    num_shards: int = 1

    def select(self, param: torch.Tensor) -> torch.Tensor:
        """The view of param this tensor fills."""
        return param[self.expert].chunk(self.num_shards, dim=0)[self.shard]


# checkpoint projection name -> (stacked parameter, shard of it): gate rows then up rows in w13
QWEN_EXPERT_PROJS = {"gate_proj": ("w13_weight", 0), "up_proj": ("w13_weight", 1),
                     "down_proj": ("w2_weight", 0)}
# `weight` and the tensors stored beside it (a quantized checkpoint's `weight_scale_inv`)
_EXPERT_NAME = re.compile(
    r"^(?P<prefix>.*\.experts)\.(?P<expert>\d+)\.(?P<proj>\w+)\.weight(?P<suffix>\w*)$")


def expert_weight(hf_name: str, projs: dict[str, tuple[str, int]]) -> ExpertWeight | None:
    """The ExpertWeight of `...experts.<e>.<proj>.weight<suffix>` for a proj in projs (the
    stacked parameter `<param><suffix>`: w13_weight_scale_inv for a gate's weight_scale_inv),
    else None."""
    match = _EXPERT_NAME.match(hf_name)
    if match is None or match["proj"] not in projs:
        return None
    param, shard = projs[match["proj"]]
    num_shards = 2 if param == "w13_weight" else 1
    return ExpertWeight(f"{match['prefix']}.{param}{match['suffix']}", int(match["expert"]),
                        shard, num_shards)


class FusedMoE(nn.Module):
    """The routed experts stacked: w13_weight [E, 2I, H] (expert e's gate rows, then its up
    rows) and w2_weight [E, H, I], with bias=True also w13_bias [E, 2I] (same row order) and
    w2_bias [E, H]; activation "silu" or "swigluoai" (GPT-OSS, with swiglu_alpha and
    swiglu_limit). forward dispatches tokens through `compiled_llm::fused_moe` (expert_op: a
    load-time transform may swap in a variant of the same contract)."""

    expert_op = staticmethod(fused_moe)

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int,
                 bias: bool = False, activation: str = "silu", swiglu_alpha: float = 1.702,
                 swiglu_limit: float = 7.0) -> None:
        super().__init__()
        check_activation(activation)
        self.num_experts, self.intermediate_size = num_experts, intermediate_size
        self.activation, self.swiglu_alpha, self.swiglu_limit = (activation, swiglu_alpha,
                                                                 swiglu_limit)
        self.w13_weight = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size,
                                                   hidden_size))
        self.w2_weight = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))
        # None stays out of state_dict: unbiased models keep their weight names
        for name, shape in (("w13_bias", (num_experts, 2 * intermediate_size)),
                            ("w2_bias", (num_experts, hidden_size))):
            setattr(self, name, nn.Parameter(torch.empty(shape)) if bias else None)

    @property
    def plain_silu(self) -> bool:
        """True for unbiased silu experts (the op's five-argument form)."""
        return self.w13_bias is None and self.w2_bias is None and self.activation == "silu"

    def forward(self, hidden: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor) -> torch.Tensor:
        """hidden [T, H], topk_weights/ids [T, K] -> the weighted sum of the experts [T, H]."""
        if self.plain_silu:  # the five-argument call existing graphs and expert_ops expect
            return self.expert_op(hidden, self.w13_weight, self.w2_weight, topk_weights,
                                  topk_ids)
        return self.expert_op(hidden, self.w13_weight, self.w2_weight, topk_weights, topk_ids,
                              self.w13_bias, self.w2_bias, self.activation, self.swiglu_alpha,
                              self.swiglu_limit)

    def extra_repr(self) -> str:
        """Experts and their sizes (activation and biases when not plain silu)."""
        extra = "" if self.plain_silu else (f", activation={self.activation}, "
                                            f"bias={self.w13_bias is not None}")
        return (f"num_experts={self.num_experts}, hidden={self.w13_weight.shape[2]}, "
                f"intermediate={self.intermediate_size}{extra}")


class SparseMoeBlock(nn.Module):
    """gate (the router) -> softmax top-k (renormalised per norm_topk_prob) -> experts, plus
    sigmoid(shared_expert_gate(x)) * shared_expert(x) when the config has a shared expert."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        moe: MoeConfig = cfg.moe
        self.top_k, self.renormalize = moe.num_experts_per_tok, moe.norm_topk_prob
        self.gate = nn.Linear(cfg.hidden_size, moe.num_experts, bias=False)
        self.experts = FusedMoE(moe.num_experts, cfg.hidden_size, moe.moe_intermediate_size)
        self.shared_expert = self.shared_expert_gate = None
        if moe.shared_expert_intermediate_size:
            self.shared_expert = GatedMLP(cfg.hidden_size, moe.shared_expert_intermediate_size)
            self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def route(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """router logits [T, E] -> (weights float32, expert ids) [T, K]."""
        return softmax_topk(router_logits, self.top_k, self.renormalize)

    def shared_output(self, hidden: torch.Tensor) -> torch.Tensor:
        """sigmoid(shared_expert_gate(x)) * shared_expert(x) [T, H]."""
        return F.sigmoid(self.shared_expert_gate(hidden)) * self.shared_expert(hidden)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, H] -> [T, H]."""
        topk_weights, topk_ids = self.route(self.gate(hidden))
        out = self.experts(hidden, topk_weights, topk_ids)
        if self.shared_expert is not None:
            out = out + self.shared_output(hidden)
        return out


def moe_or_dense_mlp(cfg: DecoderConfig, layer_idx: int) -> nn.Module:
    """The layer's MLP: a SparseMoeBlock where the config routes this layer, else GatedMLP."""
    if cfg.moe is not None and cfg.moe.is_sparse(layer_idx):
        return SparseMoeBlock(cfg)
    return GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, cfg.hidden_act)


class MoeWeightMap:
    """Mixin before a causal-LM class: checkpoint module names renamed (renamed_modules), then
    per-expert projections (expert_projs) mapped into the stacked experts' parameters."""

    renamed_modules: dict[str, str] = {}
    expert_projs: dict[str, tuple[str, int]] = QWEN_EXPERT_PROJS

    @classmethod
    def weight_name(cls, hf_name: str) -> str | ExpertWeight | None:
        """Our parameter (or the part of a stacked one) for a checkpoint tensor, None to skip."""
        for theirs, ours in cls.renamed_modules.items():
            hf_name = hf_name.replace(theirs, ours)
        return expert_weight(hf_name, cls.expert_projs) or super().weight_name(hf_name)
