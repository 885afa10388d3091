"""EXAONE 4.0 decoder (Exaone4ForCausalLM): OLMo 2's post-norm layer (each block's output normed
before its residual add, no input norms) with Qwen3's per-head q/k RMSNorms before RoPE, and
a hybrid of sliding layers (RoPE) and full-attention layers without RoPE (global NoPE)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from compiled_llm.models.cohere2 import pattern_layer_types
from compiled_llm.models.config import MOE_KEYS, DecoderConfig
from compiled_llm.models.layers import RMSNorm
from compiled_llm.models.llama import LlamaForCausalLM
from compiled_llm.models.olmo2 import Olmo2DecoderLayer, Olmo2Model
from compiled_llm.models.qwen3 import Qwen3Attention


@dataclasses.dataclass
class Exaone4Config(DecoderConfig):
    """DecoderConfig plus the layers that apply RoPE."""

    rope_layers: tuple[int, ...] = ()

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> Exaone4Config:
        """With a sliding_window: layer_types (default: every sliding_window_pattern-th layer,
        4, full), RoPE on the sliding layers alone; without one, every layer full, with RoPE
        (transformers' Exaone4Attention)."""
        hf = dict(hf_config)
        hybrid = hf.get("sliding_window", defaults.get("sliding_window")) is not None
        layers = hf["num_hidden_layers"]
        hf["layer_types"] = pattern_layer_types(hf, 4) if hybrid else ["full_attention"] * layers
        if len(hf["layer_types"]) < layers:
            raise ValueError(f"layer_types: {len(hf['layer_types'])} entries for {layers} layers")
        base = super().from_hf(hf, **defaults)
        rope = tuple(i for i in range(layers) if not hybrid or base.layer_window(i) != -1)
        return dataclasses.replace(base, rope_layers=rope)


class Exaone4Attention(Qwen3Attention):
    """Qwen3Attention (per-head q/k RMSNorms, then RoPE) with RoPE on the config's
    rope_layers alone."""

    def __init__(self, cfg: Exaone4Config, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.use_rope = layer_idx in cfg.rope_layers

    def rotate(self, q: torch.Tensor, k: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """RoPE on this layer's q and k, or (a global NoPE layer) none."""
        return super().rotate(q, k, rope) if self.use_rope else (q, k)


class Exaone4DecoderLayer(Olmo2DecoderLayer):
    """OLMo 2's post-norm layer over Exaone4Attention, with plain RMSNorms."""

    attention_cls = Exaone4Attention
    norm_cls = RMSNorm


class Exaone4Model(Olmo2Model):
    """OLMo 2's body over EXAONE 4.0 layers, its final norm a plain RMSNorm."""

    layer_cls = Exaone4DecoderLayer
    norm_cls = RMSNorm


class Exaone4ForCausalLM(LlamaForCausalLM):
    """EXAONE 4.0 for causal LM: the Llama contract over Exaone4Model. Tensor parallelism and
    LoRA as Qwen3's (Llama's projection names, per-head q/k norms left whole); pipeline
    parallelism refused by name (its body is not LlamaModel's layer loop)."""

    model_cls = Exaone4Model
    config_cls = Exaone4Config
    hf_defaults = {"rms_norm_eps": 1e-5, "sliding_window": 4096}
    # transformers' Exaone4 reads layer_types, sliding_window and sliding_window_pattern of the
    # window keys; no experts, and no bias anywhere
    hf_unread = MOE_KEYS + ("use_sliding_window", "max_window_layers", "attention_bias",
                            "qkv_bias", "o_proj_bias", "mlp_bias")
