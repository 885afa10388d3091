"""Gemma decoder (GemmaForCausalLM: Gemma 1, CodeGemma): Llama's pre-norm layers with Gemma's
embedding scaled by sqrt(hidden_size), RMSNorms whose weight is an offset from 1 (scaled in
float32, cast after), a GELU gate and a tied head."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS, DecoderConfig
from compiled_llm.models.gemma3 import GemmaScaledModel, gemma_rms_norm
from compiled_llm.models.layers import GatedMLP
from compiled_llm.models.llama import LlamaAttention, LlamaForCausalLM


class GemmaConfig(DecoderConfig):
    """DecoderConfig reading hidden_act as transformers' GemmaConfig does: the legacy "gelu"
    of the official releases means the tanh approximation."""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> GemmaConfig:
        """hf_config with hidden_act "gelu" read as "gelu_pytorch_tanh"."""
        hf = dict(hf_config)
        if hf.get("hidden_act", "gelu") == "gelu":
            hf["hidden_act"] = "gelu_pytorch_tanh"
        return super().from_hf(hf, **defaults)


class GemmaDecoderLayer(nn.Module):
    """Norm, attention, residual add; norm, GELU-gated MLP, residual add."""

    def __init__(self, cfg: DecoderConfig, layer_idx: int) -> None:
        super().__init__()
        self.sliding = False  # every layer attends fully (GemmaScaledModel's one table)
        self.self_attn = LlamaAttention(cfg, layer_idx)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, False, cfg.hidden_act)
        self.input_layernorm = gemma_rms_norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = gemma_rms_norm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden]."""
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), rope)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class GemmaModel(GemmaScaledModel):
    """The scaled embedding, Gemma's pre-norm layers, the final norm."""

    layer_cls = GemmaDecoderLayer


class GemmaForCausalLM(LlamaForCausalLM):
    """Gemma for causal LM: the Llama contract over GemmaModel (attention_bias biases o_proj
    too, as in transformers). Pipeline parallelism is refused by name (its own layer loop)."""

    model_cls = GemmaModel
    config_cls = GemmaConfig
    hf_defaults = {"head_dim": 256, "tie_word_embeddings": True, "rms_norm_eps": 1e-6,
                   "max_position_embeddings": 8192}
    # transformers' Gemma reads hidden_act (hidden_activation is Gemma 2's and 3's)
    hf_unread = WINDOW_KEYS + MOE_KEYS + ("hidden_activation", "qkv_bias", "o_proj_bias",
                                          "mlp_bias")
