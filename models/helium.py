"""Helium decoder (HeliumForCausalLM: kyutai/helium-1-2b): the Llama layout with RoPE on
interleaved pairs of dims (0, 1), (2, 3), ..., RMSNorms that scale in float32 before the cast,
an unbiased o_proj from hidden_size (so heads * head_dim must be hidden_size), and the biases on
q/k/v and the MLP that attention_bias and mlp_bias say."""

from __future__ import annotations

from typing import Any

import torch

from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS, DecoderConfig
from compiled_llm.models.layers import Float32ScaleRMSNorm
from compiled_llm.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
)
from compiled_llm.models.rotary import apply_rotary_interleaved


class HeliumConfig(DecoderConfig):
    """DecoderConfig that refuses a head shape transformers' o_proj cannot take."""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> HeliumConfig:
        """transformers' HeliumConfig keys; o_proj is hidden_size -> hidden_size there."""
        cfg = super().from_hf(hf_config, **defaults)
        if cfg.num_attention_heads * cfg.head_dim != cfg.hidden_size:
            raise ValueError(f"head_dim {cfg.head_dim} is not supported for HeliumForCausalLM: "
                             f"num_attention_heads * head_dim must be hidden_size "
                             f"{cfg.hidden_size} (transformers' o_proj is hidden_size wide)")
        return cfg


class HeliumRMSNorm(Float32ScaleRMSNorm):
    """transformers' HeliumRMSNorm ((weight * x) in float32, then the cast) with RMSNorm's
    residual form, so the Llama layer loop carries it."""

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None = None):
        """norm(hidden), or (norm(hidden + residual), hidden + residual)."""
        if residual is None:
            return super().forward(hidden)
        hidden = hidden + residual
        return super().forward(hidden), hidden


class HeliumAttention(LlamaAttention):
    """LlamaAttention with RoPE on interleaved pairs of every dim of a head."""

    def rotate(self, q: torch.Tensor, k: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """RoPE on pairs (0, 1), (2, 3), ... (transformers' repeat_interleave'd table)."""
        return apply_rotary_interleaved(q, k, rope)


class HeliumDecoderLayer(LlamaDecoderLayer):
    """The Llama layer with HeliumAttention and Helium's float32-scaled norms."""

    attention_cls = HeliumAttention

    def __init__(self, cfg: DecoderConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.input_layernorm = HeliumRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = HeliumRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class HeliumModel(LlamaModel):
    """The Llama body over Helium layers, its final norm Helium's."""

    layer_cls = HeliumDecoderLayer

    def __init__(self, cfg: DecoderConfig, max_len: int) -> None:
        super().__init__(cfg, max_len)
        self.norm = HeliumRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class HeliumForCausalLM(LlamaForCausalLM):
    """Helium for causal LM: the Llama contract over HeliumModel (tensor and pipeline
    parallelism and LoRA as Llama's: the same projections, the same layer loop)."""

    model_cls = HeliumModel
    config_cls = HeliumConfig
    # transformers' HeliumConfig defaults (config.json may leave any of them out)
    hf_defaults = {"head_dim": 128, "num_key_value_heads": 20, "rope_theta": 100000.0,
                   "rms_norm_eps": 1e-8, "max_position_embeddings": 4096,
                   "attention_bias": False, "mlp_bias": False, "o_proj_bias": False,
                   "tie_word_embeddings": False}
    # transformers' Helium never reads these: no window, no experts, o_proj never biased
    hf_unread = WINDOW_KEYS + MOE_KEYS + ("qkv_bias", "o_proj_bias")
