"""Jais 2 decoder (Jais2ForCausalLM: inceptionai's Jais 2): the Llama body's layer loop with
LayerNorms (layer_norm_eps), q/k/v/o biased where attention_bias says and an ungated
down_proj(relu2(up_proj(x))) MLP biased where mlp_bias says (both on by default)."""

from __future__ import annotations

import dataclasses
from typing import Any

from compiled_llm.models.arcee import ArceeDecoderLayer
from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS, DecoderConfig
from compiled_llm.models.layers import LayerNorm
from compiled_llm.models.llama import LlamaForCausalLM, LlamaModel


@dataclasses.dataclass
class Jais2Config(DecoderConfig):
    """DecoderConfig plus the LayerNorms' eps."""

    layer_norm_eps: float = 1e-5

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> Jais2Config:
        """transformers' Jais2Config keys."""
        base = super().from_hf(hf_config, **defaults)
        eps = hf_config.get("layer_norm_eps", defaults.get("layer_norm_eps", 1e-5))
        return dataclasses.replace(base, layer_norm_eps=eps)


class Jais2DecoderLayer(ArceeDecoderLayer):
    """Arcee's layer (the ungated MLP) with LayerNorms."""

    def __init__(self, cfg: Jais2Config, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.input_layernorm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.post_attention_layernorm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)


class Jais2Model(LlamaModel):
    """The Llama body over Jais 2 layers, its final norm a LayerNorm."""

    layer_cls = Jais2DecoderLayer

    def __init__(self, cfg: Jais2Config, max_len: int) -> None:
        super().__init__(cfg, max_len)
        self.norm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)


class Jais2ForCausalLM(LlamaForCausalLM):
    """Jais 2 for causal LM: the Llama contract over Jais2Model (pipeline parallelism as
    Llama's; tensor parallelism as Llama's, its up_proj split by rows). LoRA is refused
    by the gate_proj it lacks."""

    model_cls = Jais2Model
    config_cls = Jais2Config
    # transformers' Jais2Config defaults (config.json may leave any of them out)
    hf_defaults = {"hidden_act": "relu2", "layer_norm_eps": 1e-5, "max_position_embeddings": 8192,
                   "attention_bias": True, "mlp_bias": True, "tie_word_embeddings": False}
    # transformers' Jais 2 never reads these: no window, no experts, o_proj biased as q/k/v,
    # LayerNorms
    hf_unread = WINDOW_KEYS + MOE_KEYS + ("qkv_bias", "o_proj_bias", "rms_norm_eps")
