"""DeepSeek-V2 and -V3 (DeepseekV2/V3ForCausalLM; also Kimi-K2, Moonlight): multi-head latent
attention (MLA, models/mla.py: per-head K/V made from the latent each step), dense first
layers then MoE layers with a shared expert; V2 routes by softmax (greedy or group-limited),
V3 by grouped sigmoid scores with a correction bias (models/glm4_moe.py's block)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from compiled_llm.models.config import WINDOW_KEYS
from compiled_llm.models.glm4_moe import (
    UNREAD_MOE_KEYS,
    Glm4MoeForCausalLM,
    GroupedTopkMoeBlock,
    SharedExpertMoeConfig,
    SharedExpertMoeDecoderLayer,
)
from compiled_llm.models.mla import MlaAttention, MlaConfig, MlaModel
from compiled_llm.models.moe_routing import grouped_topk

V2_TOPK_METHODS = ("greedy", "group_limited_greedy")


@dataclasses.dataclass
class DeepseekConfig(SharedExpertMoeConfig, MlaConfig):
    """SharedExpertMoeConfig plus MLA's ranks and head dims (models/mla.py's MlaConfig)."""

    topk_method: str = "noaux_tc"  # V2's router; V3's transformers class never reads it

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> DeepseekConfig:
        """SharedExpertMoeConfig.from_hf over MlaConfig.from_hf; ValueError naming a field the
        engine cannot follow."""
        if hf_config.get("mlp_bias", defaults.get("mlp_bias")):
            # transformers' V2 biases the shared expert too; no checkpoint does
            raise ValueError("mlp_bias true is not supported for DeepSeek MLA models")
        base = super().from_hf(hf_config, **defaults)
        return dataclasses.replace(base, topk_method=hf_config.get(
            "topk_method", defaults.get("topk_method")) or "greedy")


@dataclasses.dataclass
class DeepseekV2Config(DeepseekConfig):
    """DeepseekConfig whose softmax router transformers' V2 can run as the engine does."""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> DeepseekV2Config:
        """DeepseekConfig.from_hf; ValueError for a topk_method V2 lacks, or a top_k above the
        kept groups' experts (transformers would then pick masked experts at weight 0)."""
        cfg = super().from_hf(hf_config, **defaults)
        if cfg.topk_method not in V2_TOPK_METHODS:
            raise ValueError(f"topk_method {cfg.topk_method!r} is not supported for "
                             f"DeepseekV2ForCausalLM; have {list(V2_TOPK_METHODS)}")
        kept = cfg.topk_group * cfg.moe.num_experts // cfg.n_group
        if cfg.topk_method == "group_limited_greedy" and cfg.moe.num_experts_per_tok > kept:
            raise ValueError(f"num_experts_per_tok {cfg.moe.num_experts_per_tok} is not "
                             f"supported above the {kept} experts of topk_group groups")
        return cfg


class DeepseekV2MoeBlock(GroupedTopkMoeBlock):
    """The shared-expert MoE block with DeepSeek-V2's router: softmax scores, the top-k of
    all experts (greedy) or of the topk_group best groups by their best expert
    (group_limited_greedy), never renormalised, times routed_scaling_factor."""

    def __init__(self, cfg: DeepseekConfig) -> None:
        super().__init__(cfg)
        self.gate.e_score_correction_bias = None  # V2's router has none
        if cfg.topk_method == "greedy":
            self.groups = (1, 1, cfg.routed_scaling_factor)

    def route(self, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """router logits [T, E] -> (weights float32, expert ids) [T, K]."""
        groups, topk_group, scale = self.groups
        return grouped_topk(router_logits, self.top_k, groups, topk_group, False, "softmax",
                            None, scale)


class DeepseekV3DecoderLayer(SharedExpertMoeDecoderLayer):
    """The shared-expert MoE layer (dense on the first first_k_dense_replace) with MLA."""

    attention_cls = MlaAttention


class DeepseekV2DecoderLayer(DeepseekV3DecoderLayer):
    """DeepseekV3DecoderLayer with V2's softmax router."""

    moe_cls = DeepseekV2MoeBlock


class DeepseekV3Model(MlaModel):
    """The Llama body over MLA layers; its rotary table spans qk_rope_head_dim alone."""

    layer_cls = DeepseekV3DecoderLayer


class DeepseekV2Model(DeepseekV3Model):
    """DeepseekV3Model over V2's layers."""

    layer_cls = DeepseekV2DecoderLayer


# transformers' keys both classes share, with their defaults
_COMMON_DEFAULTS = {"kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
                    "qk_rope_head_dim": 64, "v_head_dim": 128, "rms_norm_eps": 1e-6,
                    "attention_bias": False, "mlp_bias": False}


class DeepseekV3ForCausalLM(Glm4MoeForCausalLM):
    """DeepSeek-V3 for causal LM; the multi-token-prediction layer (index num_hidden_layers)
    is skipped. Tensor parallelism splits MLA by heads (MlaAttention.shard_for_tp), the
    experts as Qwen2-MoE's (routers replicated, float32); LoRA is refused for MoE models."""

    model_cls = DeepseekV3Model
    config_cls = DeepseekConfig
    hf_defaults = {**_COMMON_DEFAULTS, "n_routed_experts": 256, "n_shared_experts": 1,
                   "routed_scaling_factor": 2.5, "n_group": 8, "topk_group": 4,
                   "num_experts_per_tok": 8, "first_k_dense_replace": 3, "norm_topk_prob": True,
                   "moe_intermediate_size": 2048, "max_position_embeddings": 4096,
                   "rope_interleave": True}
    hf_unread = WINDOW_KEYS + UNREAD_MOE_KEYS + ("qkv_bias", "o_proj_bias", "mlp_bias",
                                                 "use_qk_norm", "topk_method")


class DeepseekV2ForCausalLM(DeepseekV3ForCausalLM):
    """DeepSeek-V2 (and V2-Lite) for causal LM: V3's with the softmax router, RoPE always on
    interleaved pairs; topk_method other than greedy / group_limited_greedy refused."""

    model_cls = DeepseekV2Model
    config_cls = DeepseekV2Config
    hf_defaults = {**_COMMON_DEFAULTS, "n_routed_experts": 64, "n_shared_experts": 2,
                   "routed_scaling_factor": 1.0, "n_group": None, "topk_group": None,
                   "first_k_dense_replace": 0, "norm_topk_prob": False,
                   "moe_intermediate_size": 1407, "max_position_embeddings": 2048,
                   "topk_method": "greedy", "rope_interleave": True}
    # V2's router never reads norm_topk_prob; its rope always pairs (no rope_interleave)
    hf_unread = WINDOW_KEYS + UNREAD_MOE_KEYS + ("qkv_bias", "o_proj_bias", "use_qk_norm",
                                                 "norm_topk_prob", "rope_interleave")

