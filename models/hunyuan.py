"""HunYuan dense decoder (HunYuanDenseV1ForCausalLM: Hunyuan-0.5B/1.8B/4B/7B): the Llama layout
with per-head q/k RMSNorms (query_layernorm / key_layernorm) applied after RoPE, and the NTK
alpha rope ("dynamic" with an alpha: a fixed, stretched base)."""

from __future__ import annotations

from typing import Any

import torch

from compiled_llm.config_fields import hf_rope_dict
from compiled_llm.models.config import MOE_KEYS, DecoderConfig
from compiled_llm.models.layers import RMSNorm
from compiled_llm.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
)
from compiled_llm.models.rotary import apply_rotary


class HunYuanConfig(DecoderConfig):
    """DecoderConfig reading HunYuan's NTK alpha rope as the default rope over its base."""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> DecoderConfig:
        """A "dynamic" rope with an alpha is transformers' ntk_alpha: frequencies from
        rope_theta * alpha ** (head_dim / (head_dim - 2)), the same at every length."""
        params = hf_rope_dict(hf_config)
        if params["rope_type"] != "dynamic" or not params.get("alpha"):
            return super().from_hf(hf_config, **defaults)
        alpha, dim = params["alpha"], hf_config.get("head_dim")
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
            raise ValueError(f"rope_scaling.alpha must be a number, got {alpha!r}")
        if not isinstance(dim, int) or dim <= 2:  # transformers reads config.head_dim here
            raise ValueError(f"head_dim {dim!r} is not supported with rope_scaling.alpha")
        theta = params.get("rope_theta", hf_config.get("rope_theta", 10000.0))
        base = theta * alpha ** (dim / (dim - 2))
        hf = {key: value for key, value in hf_config.items() if key != "rope_scaling"}
        hf["rope_parameters"] = {"rope_type": "default", "rope_theta": base}
        return super().from_hf(hf, **defaults)


class HunYuanAttention(LlamaAttention):
    """LlamaAttention with RoPE first, then each head of q and k RMSNormed."""

    def __init__(self, cfg: DecoderConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.query_layernorm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.key_layernorm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def rotate(self, q: torch.Tensor, k: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """q [T, H, D], k [T, Hkv, D] rotated, then normed over D (transformers' order)."""
        q, k = apply_rotary(q, k, rope)
        return self.query_layernorm(q), self.key_layernorm(k)


class HunYuanDecoderLayer(LlamaDecoderLayer):
    """The Llama layer with HunYuanAttention."""

    attention_cls = HunYuanAttention


class HunYuanModel(LlamaModel):
    """The Llama model with HunYuan layers."""

    layer_cls = HunYuanDecoderLayer


class HunYuanDenseV1ForCausalLM(LlamaForCausalLM):
    """HunYuan dense for causal LM: the Llama contract over HunYuanModel. Tensor and pipeline
    parallelism and LoRA as Llama's (its per-head q/k norms stay whole on every rank)."""

    model_cls = HunYuanModel
    config_cls = HunYuanConfig
    hf_defaults = {"rms_norm_eps": 1e-5}
    # transformers' HunYuan dense reads no window or expert keys (its checkpoints' num_experts
    # 1, use_qk_norm, use_cla and the like are unread), o_proj biased as q/k/v, MLP never biased
    hf_unread = ("sliding_window", "use_sliding_window", "max_window_layers", "layer_types",
                 *MOE_KEYS, "qkv_bias", "o_proj_bias", "mlp_bias")
