"""Qwen3 decoder: the Llama layout plus per-head RMSNorm on q and k before RoPE."""

from __future__ import annotations

import torch

from compiled_llm.models.config import MOE_KEYS, DecoderConfig
from compiled_llm.models.layers import RMSNorm
from compiled_llm.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
)


class Qwen3Attention(LlamaAttention):
    """LlamaAttention plus per-head RMSNorm of q and k (q_norm, k_norm)."""

    def __init__(self, cfg: DecoderConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def qk_norm(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, H, D], k [T, Hkv, D], each head normalised over D."""
        return self.q_norm(q), self.k_norm(k)


class Qwen3DecoderLayer(LlamaDecoderLayer):
    """The Llama layer with Qwen3Attention."""

    attention_cls = Qwen3Attention


class Qwen3Model(LlamaModel):
    """The Llama model with Qwen3 layers."""

    layer_cls = Qwen3DecoderLayer


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3 for causal LM: the Llama contract over Qwen3Model."""

    model_cls = Qwen3Model
    hf_defaults = {"use_sliding_window": False, "max_window_layers": 28, "head_dim": 128}
    hf_unread = MOE_KEYS + ("qkv_bias", "o_proj_bias", "mlp_bias")  # attention_bias: all four
