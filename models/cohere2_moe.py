"""Cohere 2 MoE decoder (Cohere2MoeForCausalLM): Cohere 2's parallel layer (interleaved RoPE on the
sliding layers, logit_scale) whose MLP is dense (prefix_dense_intermediate_size wide) where
mlp_layer_types says, else experts: the router's top-k logits weighed by their softmax (or
sigmoid, renormalised per norm_topk_prob), num_shared_experts' ungated MLP summed or averaged
in. Norms are RMSNorms where rms_norm_eps is set, else bias-free LayerNorms."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from compiled_llm.models.cohere2 import (
    FULL,
    SLIDING,
    Cohere2Config,
    Cohere2DecoderLayer,
    Cohere2ForCausalLM,
    Cohere2Model,
)
from compiled_llm.models.layers import GatedMLP, LayerNorm, RMSNorm
from compiled_llm.models.moe import MoeWeightMap, SparseMoeBlock
from compiled_llm.models.moe_routing import sigmoid_topk, softmax_topk

ARCH = "Cohere2MoeForCausalLM"
CHOICES = {"expert_selection_fn": ("softmax", "sigmoid"),
           "shared_expert_combination_strategy": ("sum", "average")}


def _layer_kinds(hf: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(layer_types, mlp_layer_types) as config.json saves them, else as transformers derives
    them from first_k_dense_replace: that many dense layers first (sliding but every
    prefix_dense_sliding_window_pattern-th), then sparse ones (every sliding_window_pattern-th
    full)."""
    layers, dense = hf["num_hidden_layers"], hf.get("first_k_dense_replace") or 0
    kinds = hf.get("layer_types")
    if not kinds:
        prefix, pattern = hf["prefix_dense_sliding_window_pattern"], hf["sliding_window_pattern"]
        kinds = ([SLIDING if (i + 1) % prefix else FULL for i in range(dense)]
                 + [SLIDING if (i + 1) % pattern else FULL for i in range(layers - dense)])
    mlp_kinds = hf.get("mlp_layer_types") or ["dense" if i < dense else "sparse"
                                              for i in range(layers)]
    for key, value, allowed in (("layer_types", kinds, (SLIDING, FULL)),
                                ("mlp_layer_types", mlp_kinds, ("dense", "sparse"))):
        if len(value) != layers or not set(value) <= set(allowed):
            raise ValueError(f"{key} {value!r} is not supported for {ARCH}: give "
                             f"{layers} of {list(allowed)}")
    return list(kinds), list(mlp_kinds)


@dataclasses.dataclass
class Cohere2MoeConfig(Cohere2Config):
    """Cohere2Config plus the dense layers' width, the router's function, how the shared
    experts combine, and which norm (RMSNorm where use_rms_norm)."""

    dense_intermediate_size: int = 0
    sigmoid_router: bool = False
    average_shared: bool = True
    use_rms_norm: bool = False

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> Cohere2MoeConfig:
        """transformers' Cohere2MoeConfig keys; cfg.moe's experts intermediate_size wide, its
        dense layers those mlp_layer_types marks; RoPE where a layer slides, or on dense layers
        when prefix_dense_sliding_window_pattern is 1 (transformers' force_rope)."""
        hf = {**defaults, **hf_config}
        for key, allowed in CHOICES.items():
            if hf.get(key) not in allowed:
                raise ValueError(f"{key} {hf.get(key)!r} is not supported for {ARCH}; "
                                 f"have {list(allowed)}")
        shared = hf.get("num_shared_experts") or 0
        kinds, mlp_kinds = _layer_kinds(hf)
        dense = [i for i, kind in enumerate(mlp_kinds) if kind == "dense"]
        rms_eps = hf.get("rms_norm_eps")
        base = super().from_hf({
            **hf_config, "layer_types": kinds, "num_experts": hf["num_experts"],
            "moe_intermediate_size": hf["intermediate_size"], "mlp_only_layers": dense,
            "shared_expert_intermediate_size": hf["intermediate_size"] * shared}, **defaults)
        force_rope = hf.get("prefix_dense_sliding_window_pattern") == 1
        rope = tuple(i for i in range(base.num_hidden_layers)
                     if i in base.rope_layers or (force_rope and i in dense))
        return dataclasses.replace(
            base, rope_layers=rope, rms_norm_eps=1e-6 if rms_eps is None else rms_eps,
            dense_intermediate_size=hf.get("prefix_dense_intermediate_size")
            or hf["intermediate_size"], use_rms_norm=rms_eps is not None,
            sigmoid_router=hf["expert_selection_fn"] == "sigmoid",
            average_shared=hf["shared_expert_combination_strategy"] == "average")


def make_norm(cfg: Cohere2MoeConfig) -> nn.Module:
    """The block and final norm: RMSNorm where rms_norm_eps is set, else Cohere's LayerNorm."""
    if cfg.use_rms_norm:
        return RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
    return LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, bias=False)


class Cohere2MoeSparseMoeBlock(SparseMoeBlock):
    """SparseMoeBlock routed by softmax (always renormalised over the top-k) or sigmoid
    (renormalised per norm_topk_prob), its ungated shared experts summed or averaged in."""

    def __init__(self, cfg: Cohere2MoeConfig) -> None:
        super().__init__(cfg)
        self.shared_expert_gate = None
        self.sigmoid_router = cfg.sigmoid_router
        self.average = cfg.average_shared and self.shared_expert is not None

    def route(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """router logits [T, E] -> (weights float32, expert ids) [T, K]."""
        if self.sigmoid_router:
            return sigmoid_topk(router_logits, self.top_k, None, self.renormalize)
        return softmax_topk(router_logits, self.top_k, True)

    def shared_output(self, hidden: torch.Tensor) -> torch.Tensor:
        """shared_expert(x) [T, H], ungated."""
        return self.shared_expert(hidden)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, H] -> [T, H]: experts + shared, halved where averaged."""
        out = super().forward(hidden)
        return out / 2 if self.average else out


class Cohere2MoeDecoderLayer(Cohere2DecoderLayer):
    """Cohere 2's parallel layer (x + attn(ln(x)) + mlp(ln(x))) with a dense or sparse MLP
    (built once: Cohere's dense MLP of intermediate_size is never made)."""

    def __init__(self, cfg: Cohere2MoeConfig, layer_idx: int) -> None:
        nn.Module.__init__(self)
        self.self_attn = self.attention_cls(cfg, layer_idx)
        self.mlp = (Cohere2MoeSparseMoeBlock(cfg) if cfg.moe.is_sparse(layer_idx) else GatedMLP(
            cfg.hidden_size, cfg.dense_intermediate_size, False, cfg.hidden_act))
        self.input_layernorm = make_norm(cfg)


class Cohere2MoeModel(Cohere2Model):
    """Cohere 2's model over Cohere 2 MoE layers and its final norm."""

    layer_cls = Cohere2MoeDecoderLayer

    def __init__(self, cfg: Cohere2MoeConfig, max_len: int) -> None:
        super().__init__(cfg, max_len)
        self.norm = make_norm(cfg)


class Cohere2MoeForCausalLM(MoeWeightMap, Cohere2ForCausalLM):
    """Cohere 2 MoE for causal LM: Cohere's contract (logits times logit_scale) over
    Cohere2MoeModel; pipeline parallelism as Llama's, tensor parallelism as the sharder's
    (per-expert checkpoint tensors, as released); LoRA is refused for MoE models."""

    model_cls = Cohere2MoeModel
    config_cls = Cohere2MoeConfig
    # transformers' Cohere2MoeConfig defaults (config.json may leave any of them out)
    hf_defaults = {**Cohere2ForCausalLM.hf_defaults, "head_dim": 128, "num_experts": 8,
                   "num_experts_per_tok": 2, "num_shared_experts": 0, "norm_topk_prob": True,
                   "shared_expert_combination_strategy": "average",
                   "expert_selection_fn": "softmax", "prefix_dense_sliding_window_pattern": 1,
                   "sliding_window_pattern": 4, "rms_norm_eps": None}
    # transformers' Cohere2Moe reads layer_types, sliding_window, num_experts and its own
    # keys; no q/k norms, o_proj biased as q/k/v, the MLPs never biased
    hf_unread = ("use_sliding_window", "max_window_layers", "use_qk_norm", "qkv_bias",
                 "o_proj_bias", "mlp_bias", "num_local_experts", "moe_intermediate_size",
                 "shared_expert_intermediate_size", "decoder_sparse_step", "mlp_only_layers")
    renamed_modules = {".mlp.shared_experts.": ".mlp.shared_expert.",
                       ".mlp.experts.gate_up_proj": ".mlp.experts.w13_weight",
                       ".mlp.experts.down_proj": ".mlp.experts.w2_weight"}

    @staticmethod
    def check_tensor_parallel(config: Cohere2MoeConfig, world: int) -> None:
        """ValueError naming tensor_parallel_size unless it divides the dense layers' MLP."""
        if config.moe.mlp_only_layers and config.dense_intermediate_size % world:
            raise ValueError(f"tensor_parallel_size {world} must divide "
                             f"prefix_dense_intermediate_size {config.dense_intermediate_size}")
