"""GLM-4.7-Flash (Glm4MoeLiteForCausalLM): DeepSeek-V3's layer, MLA (models/mla.py) over GLM-4.5's
shared-expert MoE with grouped sigmoid routing (models/glm4_moe.py); which layers stay dense
is mlp_layer_types' word (first_k_dense_replace is never read)."""

from __future__ import annotations

import dataclasses
from typing import Any

from compiled_llm.models.config import WINDOW_KEYS
from compiled_llm.models.deepseek import DeepseekConfig, DeepseekV3ForCausalLM
from compiled_llm.models.glm4_moe import UNREAD_MOE_KEYS

MLP_LAYER_TYPES = ("dense", "sparse")


def dense_layers(types: list[str], layers: int) -> tuple[int, ...]:
    """The layers mlp_layer_types calls dense (transformers reads it, where a config has it,
    over first_k_dense_replace); ValueError for a type it lacks or too few entries."""
    if len(types) < layers or any(kind not in MLP_LAYER_TYPES for kind in types):
        raise ValueError(f"mlp_layer_types {types!r} is not supported: give one of "
                         f"{list(MLP_LAYER_TYPES)} for each of the {layers} layers")
    return tuple(i for i, kind in enumerate(types[:layers]) if kind == "dense")


@dataclasses.dataclass
class Glm4MoeLiteConfig(DeepseekConfig):
    """DeepseekConfig whose dense layers are those mlp_layer_types calls dense (transformers'
    default: the first alone)."""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> Glm4MoeLiteConfig:
        """DeepseekConfig.from_hf, the dense layers from mlp_layer_types; ValueError for a
        layer type it lacks or a partial_rotary_factor (transformers' table would be shorter
        than the rope dims it turns)."""
        layers = hf_config["num_hidden_layers"]
        types = hf_config.get("mlp_layer_types") or ["dense"] + ["sparse"] * (layers - 1)
        dense = dense_layers(types, layers)
        cfg = super().from_hf(hf_config, **defaults)
        factor = cfg.rope_scaling.get("partial_rotary_factor", 1.0)
        if int(cfg.qk_rope_head_dim * factor) != cfg.qk_rope_head_dim:
            raise ValueError(f"partial_rotary_factor {factor!r} is not supported for "
                             "Glm4MoeLiteForCausalLM: MLA turns every qk_rope_head_dim dim")
        return dataclasses.replace(cfg, moe=dataclasses.replace(cfg.moe, mlp_only_layers=dense))


class Glm4MoeLiteForCausalLM(DeepseekV3ForCausalLM):
    """GLM-4.7-Flash for causal LM: DeepSeek-V3's model under GLM-4.7-Flash's config; the
    multi-token-prediction layer (index num_hidden_layers) is skipped. Tensor parallelism as
    DeepSeek-V3's (MLA by heads); LoRA is refused for MoE models."""

    config_cls = Glm4MoeLiteConfig
    # transformers' Glm4MoeLiteConfig defaults
    hf_defaults = {"kv_lora_rank": 512, "q_lora_rank": 768, "qk_nope_head_dim": 192,
                   "qk_rope_head_dim": 64, "v_head_dim": 256, "rms_norm_eps": 1e-5,
                   "attention_bias": False, "mlp_bias": False, "n_routed_experts": 64,
                   "n_shared_experts": 1, "routed_scaling_factor": 1.8, "n_group": 1,
                   "topk_group": 1, "num_experts_per_tok": 4, "norm_topk_prob": True,
                   "moe_intermediate_size": 1536, "max_position_embeddings": 202752,
                   "num_key_value_heads": 20, "rope_interleave": True}
    # DeepSeek-V3's unread keys, and first_k_dense_replace (mlp_layer_types decides)
    hf_unread = WINDOW_KEYS + UNREAD_MOE_KEYS + (
        "qkv_bias", "o_proj_bias", "mlp_bias", "use_qk_norm", "topk_method",
        "first_k_dense_replace")
