"""Solar Open decoder (SolarOpenForCausalLM: upstage/Solar-Open-100B): Llama attention (q/k/v
biased where attention_bias says, o_proj never; RoPE on every dim) over GLM-4.5's MoE in every
layer: a float32 sigmoid router choosing within groups by score plus e_score_correction_bias,
weights times routed_scaling_factor, an ungated shared expert (n_shared_experts wide)."""

from __future__ import annotations

import dataclasses
from typing import Any

from compiled_llm.config_fields import hf_rope_dict
from compiled_llm.models.config import WINDOW_KEYS
from compiled_llm.models.glm4_moe import (
    UNREAD_MOE_KEYS,
    Glm4MoeForCausalLM,
    SharedExpertMoeConfig,
    SharedExpertMoeDecoderLayer,
)
from compiled_llm.models.llama import LlamaAttention, LlamaModel


@dataclasses.dataclass
class SolarOpenConfig(SharedExpertMoeConfig):
    """SharedExpertMoeConfig with every layer sparse, no q/k norms, RoPE on every dim."""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> SolarOpenConfig:
        """GLM-4.5's MoE keys (first_k_dense_replace and use_qk_norm are not Solar Open's); a
        partial_rotary_factor other than 1 (a table narrower than the heads transformers
        rotates whole: it cannot run) is refused by name."""
        factor = hf_rope_dict(hf_config).get(
            "partial_rotary_factor", hf_config.get("partial_rotary_factor", 1.0))
        if factor != 1.0:
            raise ValueError(f"partial_rotary_factor {factor!r} is not supported for "
                             "SolarOpenForCausalLM: its attention turns every dim")
        hf = {key: value for key, value in hf_config.items() if key != "partial_rotary_factor"}
        # intermediate_size (no dense layer reads it) stands at the experts' width
        width = hf.get("moe_intermediate_size", defaults.get("moe_intermediate_size"))
        return super().from_hf({**hf, "first_k_dense_replace": 0, "use_qk_norm": False,
                                "intermediate_size": width}, **defaults)


class SolarOpenDecoderLayer(SharedExpertMoeDecoderLayer):
    """The shared-expert MoE layer with Llama's attention."""

    attention_cls = LlamaAttention


class SolarOpenModel(LlamaModel):
    """The Llama body over Solar Open layers."""

    layer_cls = SolarOpenDecoderLayer


class SolarOpenForCausalLM(Glm4MoeForCausalLM):
    """Solar Open for causal LM: GLM-4.5's contract (its checkpoint names, tensor parallelism
    as Qwen2-MoE's, LoRA refused for MoE models) over SolarOpenModel."""

    model_cls = SolarOpenModel
    config_cls = SolarOpenConfig
    # transformers' SolarOpenConfig defaults
    hf_defaults = {"n_routed_experts": 128, "n_shared_experts": 1, "n_group": 1,
                   "topk_group": 1, "routed_scaling_factor": 1.0, "num_experts_per_tok": 8,
                   "moe_intermediate_size": 1280, "norm_topk_prob": True, "rms_norm_eps": 1e-5,
                   "max_position_embeddings": 131072, "num_key_value_heads": 8,
                   "head_dim": 128, "rope_theta": 1e6, "attention_bias": False,
                   "o_proj_bias": False, "tie_word_embeddings": False}
    # no window, no dense layers (intermediate_size unread), no q/k norms, no MLP biases
    hf_unread = WINDOW_KEYS + UNREAD_MOE_KEYS + (
        "qkv_bias", "o_proj_bias", "mlp_bias", "first_k_dense_replace", "use_qk_norm")
