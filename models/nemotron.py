"""Nemotron decoder (NemotronForCausalLM: Nemotron-4, Minitron, Nemotron-Mini): the Llama body's
layer loop with LayerNorm1P norms (LayerNorms with bias whose weight is an offset from 1), RoPE
on the leading partial_rotary_factor of each head (half by default), biased q/k/v/o where
attention_bias, and an ungated down_proj(relu2(up_proj(x))) MLP. Attention is the one opaque op."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F

from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS
from compiled_llm.models.layers import DenseMLP, LayerNorm
from compiled_llm.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
)
from compiled_llm.models.rotary import PartialRotaryConfig, apply_partial_rotary


@dataclasses.dataclass
class NemotronConfig(PartialRotaryConfig):
    """PartialRotaryConfig read from transformers' NemotronConfig keys: norm_eps for the norms,
    partial_rotary_factor 0.5 unless the config says."""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> NemotronConfig:
        """transformers' NemotronConfig keys (norm_eps is its LayerNorms' eps)."""
        hf = dict(hf_config)
        hf.setdefault("partial_rotary_factor", 0.5)  # read where rope_parameters lacks it
        hf["layer_norm_eps"] = hf.get("norm_eps", defaults.get("norm_eps", 1e-5))
        return super().from_hf(hf, **defaults)


class LayerNorm1P(LayerNorm):
    """LayerNorm (with bias) that scales by (1 + weight), in LayerNorm's residual form."""

    def norm(self, hidden: torch.Tensor) -> torch.Tensor:
        """The (1 + weight) LayerNorm of hidden [..., dim]."""
        return F.layer_norm(hidden, self.normalized_shape, self.weight + 1.0, self.bias, self.eps)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None = None):
        """norm(hidden), or (norm(hidden + residual), hidden + residual)."""
        if residual is None:
            return self.norm(hidden)
        hidden = hidden + residual
        return self.norm(hidden), hidden


class NemotronAttention(LlamaAttention):
    """Llama's attention with RoPE on the leading rotary_dim dims of each head."""

    def __init__(self, cfg: NemotronConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.rotary_dim = cfg.rotary_dim

    def rotate(self, q: torch.Tensor, k: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """RoPE on the leading rotary_dim dims of each head; the rest pass through."""
        return apply_partial_rotary(q, k, rope, self.rotary_dim)


class NemotronDecoderLayer(LlamaDecoderLayer):
    """The Llama layer with LayerNorm1P norms and the ungated relu2 MLP."""

    attention_cls = NemotronAttention

    def __init__(self, cfg: NemotronConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.mlp = DenseMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act,
                            names=("up_proj", "down_proj"), bias=cfg.mlp_bias)
        self.input_layernorm = LayerNorm1P(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.post_attention_layernorm = LayerNorm1P(cfg.hidden_size, eps=cfg.layer_norm_eps)


class NemotronModel(LlamaModel):
    """The Llama body over Nemotron layers: a LayerNorm1P at the end, the rotary table of the
    rotary dims."""

    layer_cls = NemotronDecoderLayer

    def __init__(self, cfg: NemotronConfig, max_len: int) -> None:
        super().__init__(cfg, max_len)
        self.norm = LayerNorm1P(cfg.hidden_size, eps=cfg.layer_norm_eps)

    @staticmethod
    def rotary_config(cfg: NemotronConfig) -> NemotronConfig:
        """The table of the rotary dims alone."""
        return dataclasses.replace(cfg, head_dim=cfg.rotary_dim)


class NemotronForCausalLM(LlamaForCausalLM):
    """Nemotron for causal LM: the Llama contract over NemotronModel (pipeline parallelism as
    Llama's; tensor parallelism as Llama's, its up_proj split by rows). LoRA is refused
    by the gate_proj it lacks."""

    model_cls = NemotronModel
    config_cls = NemotronConfig
    # transformers' NemotronConfig defaults (config.json may leave any of them out)
    hf_defaults = {"hidden_act": "relu2", "norm_eps": 1e-5, "max_position_embeddings": 4096,
                   "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False}
    # transformers' Nemotron never reads these: no window, no experts, o_proj biased as q/k/v,
    # its norms' eps is norm_eps
    hf_unread = WINDOW_KEYS + MOE_KEYS + ("qkv_bias", "o_proj_bias", "rms_norm_eps",
                                          "layer_norm_eps")
