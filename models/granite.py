"""Granite decoder (IBM Granite 3.x dense): the Llama layout with four scalars from its config:
embeddings times embedding_multiplier, attention scaled by attention_multiplier (not
head_dim ** -0.5), each attention and MLP output times residual_multiplier before its residual
add, and logits divided by logits_scaling."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS, DecoderConfig
from compiled_llm.models.layers import GatedMLP
from compiled_llm.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
)

MULTIPLIERS = ("embedding_multiplier", "attention_multiplier", "residual_multiplier",
               "logits_scaling")


@dataclasses.dataclass
class GraniteConfig(DecoderConfig):
    """DecoderConfig plus Granite's scalars (transformers' defaults: 1.0 each)."""

    embedding_multiplier: float = 1.0
    attention_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> GraniteConfig:
        """The Llama keys, then the four scalars."""
        base = super().from_hf(hf_config, **defaults)
        return dataclasses.replace(base, **{key: float(hf_config.get(key, 1.0))
                                            for key in MULTIPLIERS})


class GraniteAttention(LlamaAttention):
    """LlamaAttention scaled by attention_multiplier, its output times residual_multiplier."""

    def __init__(self, cfg: GraniteConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.scale = cfg.attention_multiplier
        self.residual_multiplier = cfg.residual_multiplier

    def forward(self, hidden: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """hidden [T, hidden] -> [T, hidden], scaled for the residual add."""
        return super().forward(hidden, rope) * self.residual_multiplier


class GraniteMLP(GatedMLP):
    """GatedMLP whose output is times residual_multiplier."""

    def __init__(self, cfg: GraniteConfig) -> None:
        super().__init__(cfg.hidden_size, cfg.intermediate_size, cfg.mlp_bias, cfg.hidden_act)
        self.residual_multiplier = cfg.residual_multiplier

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> [T, hidden], scaled for the residual add."""
        return super().forward(hidden) * self.residual_multiplier


class GraniteDecoderLayer(LlamaDecoderLayer):
    """The Llama layer with GraniteAttention and GraniteMLP."""

    attention_cls = GraniteAttention

    def __init__(self, cfg: GraniteConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.mlp = GraniteMLP(cfg)


class ScaledEmbedding(nn.Embedding):
    """An embedding times a constant (the weight stays the checkpoint's, for a tied head)."""

    def __init__(self, num: int, dim: int, multiplier: float) -> None:
        super().__init__(num, dim)
        self.multiplier = multiplier

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [T] -> [T, dim]."""
        return super().forward(input_ids) * self.multiplier


class GraniteModel(LlamaModel):
    """The Llama model with Granite layers and embeddings times embedding_multiplier."""

    layer_cls = GraniteDecoderLayer

    def __init__(self, cfg: GraniteConfig, max_len: int) -> None:
        super().__init__(cfg, max_len)
        self.embed_tokens = ScaledEmbedding(cfg.vocab_size, cfg.hidden_size,
                                            cfg.embedding_multiplier)


class GraniteForCausalLM(LlamaForCausalLM):
    """Granite for causal LM: the Llama contract over GraniteModel, logits / logits_scaling.
    LoRA and tensor parallelism take it as the Llama layout it is."""

    model_cls = GraniteModel
    config_cls = GraniteConfig
    hf_unread = WINDOW_KEYS + MOE_KEYS + ("qkv_bias", "o_proj_bias")

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> logits [N, vocab], divided by logits_scaling."""
        return self.lm_head(hidden) / self.config.logits_scaling
