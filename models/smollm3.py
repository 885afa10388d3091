"""SmolLM3 decoder: the Llama layout whose layers skip RoPE where no_rope_layers says 0 (every
no_rope_layer_interval-th layer by default: NoPE), with a sliding window only where
use_sliding_window and layer_types both say so."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from compiled_llm.models.config import MOE_KEYS, DecoderConfig
from compiled_llm.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
)


@dataclasses.dataclass
class SmolLM3Config(DecoderConfig):
    """DecoderConfig plus the layers that apply RoPE (empty: every layer)."""

    rope_layers: tuple[int, ...] = ()

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> SmolLM3Config:
        """transformers' no_rope_layers (1: RoPE), else every layer but each
        no_rope_layer_interval-th (default 4)."""
        base = super().from_hf(hf_config, **defaults)
        flags = hf_config.get("no_rope_layers")
        if not flags:
            interval = hf_config.get("no_rope_layer_interval") or 4
            flags = [int((i + 1) % interval != 0) for i in range(base.num_hidden_layers)]
        if len(flags) < base.num_hidden_layers:
            raise ValueError(f"no_rope_layers: {len(flags)} entries for "
                             f"{base.num_hidden_layers} layers")
        return dataclasses.replace(base, rope_layers=tuple(i for i, flag in enumerate(flags)
                                                           if flag))


class SmolLM3Attention(LlamaAttention):
    """LlamaAttention with RoPE only on the config's rope_layers."""

    def __init__(self, cfg: SmolLM3Config, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.use_rope = layer_idx in cfg.rope_layers

    def rotate(self, q: torch.Tensor, k: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """RoPE on this layer's q and k, or (a NoPE layer) none."""
        return super().rotate(q, k, rope) if self.use_rope else (q, k)


class SmolLM3DecoderLayer(LlamaDecoderLayer):
    """The Llama layer with SmolLM3Attention."""

    attention_cls = SmolLM3Attention


class SmolLM3Model(LlamaModel):
    """The Llama model with SmolLM3 layers."""

    layer_cls = SmolLM3DecoderLayer


class SmolLM3ForCausalLM(LlamaForCausalLM):
    """SmolLM3 for causal LM: the Llama contract over SmolLM3Model."""

    model_cls = SmolLM3Model
    config_cls = SmolLM3Config
    hf_defaults = {"rope_theta": 2e6, "tie_word_embeddings": True, "use_sliding_window": False}
    hf_unread = MOE_KEYS + ("qkv_bias", "o_proj_bias", "max_window_layers")
