"""Cohere 2 decoder (Cohere2ForCausalLM: Command R7B): Cohere's parallel layer (bias-free
LayerNorm, attention and gated MLP off one norm, interleaved RoPE, logit_scale) with a sliding
window on the layers layer_types marks sliding, and no RoPE at all on the full-attention ones."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from compiled_llm.models.cohere import (
    CohereAttention,
    CohereConfig,
    CohereDecoderLayer,
    CohereForCausalLM,
    CohereModel,
)
from compiled_llm.models.config import MOE_KEYS

SLIDING, FULL = "sliding_attention", "full_attention"


def pattern_layer_types(hf: dict[str, Any], default_pattern: int) -> list[str]:
    """config.json's layer_types, else transformers' rule for configs saved without them: every
    sliding_window_pattern-th layer full, the others sliding (ValueError for a pattern that is
    not a positive int: transformers cannot derive layer types from it either)."""
    if hf.get("layer_types"):
        return list(hf["layer_types"])
    pattern = hf.get("sliding_window_pattern")
    pattern = default_pattern if pattern is None else pattern
    if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
        raise ValueError(f"sliding_window_pattern {pattern!r} is not supported without "
                         "layer_types; give layer_types, or a positive int pattern")
    return [SLIDING if (i + 1) % pattern else FULL for i in range(hf["num_hidden_layers"])]


@dataclasses.dataclass
class Cohere2Config(CohereConfig):
    """CohereConfig plus the layers that apply RoPE (the sliding ones)."""

    rope_layers: tuple[int, ...] = ()

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> Cohere2Config:
        """Cohere's keys; layer_types (default: sliding_window_pattern 4); transformers turns
        RoPE on where a layer slides, which needs a sliding_window."""
        hf = {**hf_config, "layer_types": pattern_layer_types(hf_config, 4)}
        if len(hf["layer_types"]) < hf["num_hidden_layers"]:
            raise ValueError(f"layer_types: {len(hf['layer_types'])} entries for "
                             f"{hf['num_hidden_layers']} layers")
        base = super().from_hf(hf, **defaults)
        rope = tuple(i for i in range(base.num_hidden_layers) if base.layer_window(i) != -1)
        return dataclasses.replace(base, rope_layers=rope)


class Cohere2Attention(CohereAttention):
    """CohereAttention (no q/k norms) with RoPE only on the sliding layers."""

    def __init__(self, cfg: Cohere2Config, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.use_rope = layer_idx in cfg.rope_layers

    def rotate(self, q: torch.Tensor, k: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """Interleaved RoPE on a sliding layer's q and k; a full layer's as they are."""
        return super().rotate(q, k, rope) if self.use_rope else (q, k)


class Cohere2DecoderLayer(CohereDecoderLayer):
    """Cohere's parallel layer with Cohere2Attention."""

    attention_cls = Cohere2Attention


class Cohere2Model(CohereModel):
    """Cohere's model with Cohere 2 layers."""

    layer_cls = Cohere2DecoderLayer


class Cohere2ForCausalLM(CohereForCausalLM):
    """Cohere 2 for causal LM: Cohere's contract over Cohere2Model. Tensor, pipeline
    parallelism and LoRA as Cohere's (q/k/v/o and gate/up/down under Llama's names)."""

    model_cls = Cohere2Model
    config_cls = Cohere2Config
    hf_defaults = {"rope_theta": 10000.0, "layer_norm_eps": 1e-5, "logit_scale": 0.0625,
                   "tie_word_embeddings": True, "max_position_embeddings": 8192,
                   "sliding_window": 4096}
    # transformers' Cohere2 reads layer_types and sliding_window alone of the window keys, no
    # experts, no q/k norms, o_proj biased as q/k/v, the MLP never biased, LayerNorms only
    hf_unread = MOE_KEYS + ("use_sliding_window", "max_window_layers", "use_qk_norm",
                            "qkv_bias", "o_proj_bias", "mlp_bias", "rms_norm_eps")
