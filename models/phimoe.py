"""PhiMoE (PhimoeForCausalLM: Phi-3.5-MoE): the Llama layer with biased LayerNorms, q/k/v/o
biased where attention_bias says, an LM head biased where lm_head_bias says, one sliding_window
on every layer (if any), and a sparse MoE block in every layer routed by sparsemixer (top-2 at
inference). Checkpoints name the block `block_sparse_moe` and the experts' gate, down and up
projections w1, w2 and w3, as Mixtral's do."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch
from torch import nn

from compiled_llm.models.config import DecoderConfig
from compiled_llm.models.layers import LayerNorm
from compiled_llm.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaModel
from compiled_llm.models.moe import MoeWeightMap, SparseMoeBlock
from compiled_llm.models.moe_routing import sparsemixer_top2


@dataclasses.dataclass
class PhimoeConfig(DecoderConfig):
    """DecoderConfig plus sparsemixer's router_jitter_noise and the LM head's bias."""

    long_rope_recompute: ClassVar[bool] = True  # as Phi-3's (models/phi3.py)

    router_jitter_noise: float = 0.01
    lm_head_bias: bool = False

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> PhimoeConfig:
        """transformers' PhimoeConfig keys. Its rotary scales cos and sin by short_mscale
        (long_mscale past the original length) for any rope type but the default: supported
        for LongRoPE with the two equal (Phi-3.5-MoE's), as its attention_factor."""
        hf = dict(hf_config)
        for key in ("rope_scaling", "rope_parameters"):
            rope = hf.get(key)
            if isinstance(rope, dict) and rope:
                hf[key] = _mscaled_rope(rope)
        get = {**defaults, **hf}.get
        if get("num_experts_per_tok") != 2:
            raise ValueError(f"num_experts_per_tok {get('num_experts_per_tok')!r} is not "
                             "supported for PhimoeForCausalLM: sparsemixer routes to 2 experts")
        base = super().from_hf(hf, **defaults)
        return dataclasses.replace(base, router_jitter_noise=float(get("router_jitter_noise")),
                                   lm_head_bias=bool(get("lm_head_bias")))


def _mscaled_rope(rope: dict[str, Any]) -> dict[str, Any]:
    """The rope dict with PhiMoE's mscale as LongRoPE's attention_factor; ValueError naming
    rope_type or the mscales for what the rotary table cannot follow."""
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return rope
    if kind != "longrope":
        raise ValueError(f"rope_scaling.rope_type {kind!r} is not supported for "
                         "PhimoeForCausalLM (have 'default' and 'longrope')")
    short, long = rope.get("short_mscale"), rope.get("long_mscale")
    if not isinstance(short, (int, float)) or short != long:
        raise ValueError(f"rope_scaling.short_mscale {short!r} and long_mscale {long!r} must be "
                         "equal numbers for PhimoeForCausalLM")
    return {**rope, "attention_factor": float(short)}


class PhimoeMoeBlock(SparseMoeBlock):
    """SparseMoeBlock (router `gate`, no shared expert) routed by sparsemixer."""

    def __init__(self, cfg: PhimoeConfig) -> None:
        super().__init__(cfg)
        self.jitter_eps = cfg.router_jitter_noise

    def route(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """router logits [T, E] -> sparsemixer's (weights, expert ids) [T, 2]."""
        return sparsemixer_top2(router_logits, self.jitter_eps)


class PhimoeDecoderLayer(LlamaDecoderLayer):
    """The Llama layer with biased LayerNorms (eps rms_norm_eps) and the sparsemixer block."""

    def __init__(self, cfg: PhimoeConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.mlp = PhimoeMoeBlock(cfg)
        self.input_layernorm = LayerNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = LayerNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)


class PhimoeModel(LlamaModel):
    """The Llama body over PhiMoE layers, its final norm a biased LayerNorm."""

    layer_cls = PhimoeDecoderLayer

    def __init__(self, cfg: PhimoeConfig, max_len: int) -> None:
        super().__init__(cfg, max_len)
        self.norm = LayerNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)


class PhimoeForCausalLM(MoeWeightMap, LlamaForCausalLM):
    """PhiMoE for causal LM: the Llama contract over PhimoeModel (pipeline and tensor
    parallelism as Mixtral's; biases are sharded with their rows, the LM head's by vocab);
    LoRA is refused for MoE models."""

    model_cls = PhimoeModel
    config_cls = PhimoeConfig
    # transformers' PhimoeConfig defaults
    hf_defaults = {"rope_theta": 1e6, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
                   "num_key_value_heads": 8, "num_local_experts": 16, "num_experts_per_tok": 2,
                   "router_jitter_noise": 0.01, "lm_head_bias": False, "sliding_window": None}
    # it reads num_local_experts, num_experts_per_tok and intermediate_size (per expert) of the
    # MoE keys, its sliding_window on every layer, attention_bias for q/k/v and o_proj
    hf_unread = ("num_experts", "moe_intermediate_size", "norm_topk_prob",
                 "shared_expert_intermediate_size", "decoder_sparse_step", "mlp_only_layers",
                 "use_sliding_window", "max_window_layers", "layer_types", "qkv_bias",
                 "o_proj_bias", "mlp_bias")
    renamed_modules = {".block_sparse_moe.": ".mlp."}
    expert_projs = {"w1": ("w13_weight", 0), "w3": ("w13_weight", 1), "w2": ("w2_weight", 0)}

    def __init__(self, cfg: PhimoeConfig, max_len: int | None = None) -> None:
        super().__init__(cfg, max_len)
        if cfg.lm_head_bias:
            self.lm_head.bias = nn.Parameter(torch.zeros(cfg.vocab_size))
