"""A.X-K1 (AXK1ForCausalLM): DeepSeek-V3's layer (MLA with a q latent over the grouped sigmoid
shared-expert MoE, models/deepseek.py) with one change, a post_mlp_layernorm on each MoE block's
output; which layers stay dense is mlp_layer_types' word (transformers 5.25), else
first_k_dense_replace / moe_layer_freq (the rule both 5.17 and 5.25 read)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch

from compiled_llm.models.config import WINDOW_KEYS
from compiled_llm.models.deepseek import DeepseekV3DecoderLayer, DeepseekV3Model
from compiled_llm.models.glm4_moe import UNREAD_MOE_KEYS
from compiled_llm.models.glm4_moe_lite import Glm4MoeLiteConfig, Glm4MoeLiteForCausalLM
from compiled_llm.models.layers import RMSNorm

_POST_MLP_NORM = re.compile(r"^model\.layers\.(\d+)\.(?:mlp\.)?post_mlp_layernorm\.")


def axk_mlp_layer_types(hf_config: dict[str, Any]) -> list[str]:
    """The layers' MLP types as transformers 5.25 reads them for A.X-K1 and A.X-K2:
    mlp_layer_types, else sparse from first_k_dense_replace (1) on, every moe_layer_freq-th
    (1) layer."""
    first = hf_config.get("first_k_dense_replace", 1)
    freq = hf_config.get("moe_layer_freq", 1)
    return hf_config.get("mlp_layer_types") or [
        "sparse" if i >= first and i % freq == 0 else "dense"
        for i in range(hf_config["num_hidden_layers"])]


@dataclasses.dataclass
class AXK1Config(Glm4MoeLiteConfig):
    """Glm4MoeLiteConfig (dense layers from mlp_layer_types) read by A.X-K1's rule."""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> AXK1Config:
        """Glm4MoeLiteConfig.from_hf over axk_mlp_layer_types; ValueError for no q latent
        (transformers 5.25's attention always projects q through q_a_proj) or dense layers
        transformers 5.17 would place otherwise."""
        if hf_config.get("q_lora_rank", defaults.get("q_lora_rank")) is None:
            raise ValueError("q_lora_rank null is not supported for AXK1ForCausalLM: "
                             "transformers 5.25's attention always has q_a_proj")
        types, layers = axk_mlp_layer_types(hf_config), hf_config["num_hidden_layers"]
        first = hf_config.get("first_k_dense_replace", 1)  # 5.17's sole rule, default 1
        if types[:layers] != ["dense" if i < first else "sparse" for i in range(layers)]:
            raise ValueError(f"mlp_layer_types {types!r} is not supported for AXK1ForCausalLM:"
                             " transformers 5.17 makes the layers from first_k_dense_replace "
                             f"{first!r} on sparse (moe_layer_freq, mlp_layer_types unread)")
        return super().from_hf({**hf_config, "mlp_layer_types": types}, **defaults)


class AXK1DecoderLayer(DeepseekV3DecoderLayer):
    """DeepSeek-V3's layer; a MoE layer norms its MoE block's output (post_mlp_layernorm,
    held at the layer as the checkpoints store it) before the residual add."""

    def __init__(self, cfg: AXK1Config, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.post_mlp_layernorm = (RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
                                   if cfg.moe.is_sparse(layer_idx) else None)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None, rope):
        """DeepseekV3DecoderLayer's (MLP output, residual), the MoE output normed."""
        hidden, residual = super().forward(hidden, residual, rope)
        if self.post_mlp_layernorm is not None:
            hidden = self.post_mlp_layernorm(hidden)
        return hidden, residual


class AXK1Model(DeepseekV3Model):
    """DeepSeek-V3's body over A.X-K1's layers."""

    layer_cls = AXK1DecoderLayer


class AXK1ForCausalLM(Glm4MoeLiteForCausalLM):
    """A.X-K1 for causal LM: DeepSeek-V3's model with the MoE output norm; the multi-token-
    prediction layers are skipped. Tensor parallelism as DeepSeek-V3's (MLA by heads); LoRA
    is refused for MoE models."""

    model_cls = AXK1Model
    config_cls = AXK1Config
    # released checkpoints route without it: transformers' zeros
    zero_when_absent = ("e_score_correction_bias",)
    # transformers' AXK1Config defaults
    hf_defaults = {"kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
                   "qk_rope_head_dim": 64, "v_head_dim": 128, "rms_norm_eps": 1e-6,
                   "attention_bias": False, "n_routed_experts": 192, "n_shared_experts": 1,
                   "routed_scaling_factor": 2.5, "n_group": 8, "topk_group": 4,
                   "num_experts_per_tok": 8, "norm_topk_prob": True,
                   "moe_intermediate_size": 2048, "max_position_embeddings": 32768,
                   "num_key_value_heads": 64, "rope_interleave": True}
    # DeepSeek-V3's unread keys (first_k_dense_replace is read: axk_mlp_layer_types)
    hf_unread = WINDOW_KEYS + UNREAD_MOE_KEYS + ("qkv_bias", "o_proj_bias", "mlp_bias",
                                                 "use_qk_norm", "topk_method")

    def weight_name(self, hf_name: str):
        """Glm4MoeLiteForCausalLM's target; a MoE layer's post_mlp_layernorm at the layer
        (transformers' own name, mlp.post_mlp_layernorm, too), None for a dense layer's (the
        released checkpoints store one, unused)."""
        norm = _POST_MLP_NORM.match(hf_name)
        if norm is not None:
            layer = int(norm[1])
            if layer < self.checkpoint_layers and not self.config.moe.is_sparse(layer):
                return None
            hf_name = hf_name.replace(".mlp.post_mlp_layernorm.", ".post_mlp_layernorm.")
        return super().weight_name(hf_name)
