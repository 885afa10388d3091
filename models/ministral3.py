"""Ministral 3 decoder (Ministral3ForCausalLM: the text stack of the Ministral 3 releases):
Mistral's unbiased Llama layout (a sliding window on every layer where sliding_window is set,
none by default) whose queries, after RoPE, are scaled per position by Llama 4's
1 + llama_4_scaling_beta * log(1 + floor(position / original_max_position_embeddings));
YaRN by default. The scale rides with the rotary table, so the Llama body is unchanged."""

from __future__ import annotations

from typing import Any

import torch

from compiled_llm.models.config import MOE_KEYS, DecoderConfig
from compiled_llm.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
)
from compiled_llm.models.rotary import RotaryEmbedding, apply_rotary


class Ministral3Config(DecoderConfig):
    """DecoderConfig that requires what transformers' Ministral 3 attention reads from
    rope_parameters: llama_4_scaling_beta and original_max_position_embeddings."""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> Ministral3Config:
        """transformers' Ministral3Config keys; its YaRN default where the config names no
        RoPE."""
        hf = dict(hf_config)
        if "rope_parameters" not in hf and "rope_scaling" not in hf:
            hf["rope_parameters"] = dict(defaults["rope_parameters"])
        base = super().from_hf(hf, **defaults)
        for key in ("llama_4_scaling_beta", "original_max_position_embeddings"):
            if not isinstance(base.rope_scaling.get(key), (int, float)):
                raise ValueError(f"rope_parameters.{key} is required for Ministral3ForCausalLM "
                                 "(its attention scales queries by it)")
        return base


class Llama4ScaledRotaryEmbedding(RotaryEmbedding):
    """RotaryEmbedding whose step output also carries each token's query scale."""

    def __init__(self, cfg: DecoderConfig, max_len: int) -> None:
        super().__init__(cfg, max_len)
        self.beta = float(cfg.rope_scaling["llama_4_scaling_beta"])
        self.original_len = cfg.rope_scaling["original_max_position_embeddings"]

    def forward(self, positions: torch.Tensor):
        """(cos, sin) [T, 1, D] and the query scale [T, 1, 1] (float32, as transformers)."""
        cos, sin = super().forward(positions)
        blocks = torch.floor(positions.float() / self.original_len)  # [T]
        scale = 1 + self.beta * torch.log(1 + blocks)
        return cos, sin, scale[:, None, None]


class Ministral3Attention(LlamaAttention):
    """Llama's attention with the queries scaled per position after RoPE."""

    def rotate(self, q: torch.Tensor, k: torch.Tensor, rope):
        """RoPE on every dim, then q times its token's Llama 4 scale."""
        cos, sin, scale = rope
        q, k = apply_rotary(q, k, (cos, sin))
        return q * scale.to(q.dtype), k


class Ministral3DecoderLayer(LlamaDecoderLayer):
    """The Llama layer with Ministral3Attention."""

    attention_cls = Ministral3Attention


class Ministral3Model(LlamaModel):
    """The Llama body over Ministral 3 layers; its rotary table adds the query scale."""

    layer_cls = Ministral3DecoderLayer

    def __init__(self, cfg: Ministral3Config, max_len: int) -> None:
        super().__init__(cfg, max_len)
        self.rotary_emb = Llama4ScaledRotaryEmbedding(cfg, max_len)


class Ministral3ForCausalLM(LlamaForCausalLM):
    """Ministral 3 for causal LM: the Llama contract over Ministral3Model (tensor and pipeline
    parallelism and LoRA as Llama's)."""

    model_cls = Ministral3Model
    config_cls = Ministral3Config
    # transformers' Ministral3Config defaults (config.json may leave any of them out)
    hf_defaults = {"head_dim": 128, "num_key_value_heads": 8, "rms_norm_eps": 1e-5,
                   "max_position_embeddings": 262144, "tie_word_embeddings": False,
                   "rope_parameters": {
                       "rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0,
                       "original_max_position_embeddings": 16384, "beta_fast": 32.0,
                       "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0,
                       "llama_4_scaling_beta": 0.1}}
    # transformers' Ministral 3 never reads these: q/k/v/o and the MLP unbiased, no experts,
    # its window (when set) on every layer
    hf_unread = MOE_KEYS + ("use_sliding_window", "max_window_layers", "layer_types",
                            "attention_bias", "qkv_bias", "o_proj_bias", "mlp_bias")
