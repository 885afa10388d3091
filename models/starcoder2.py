"""StarCoder2 decoder (Starcoder2ForCausalLM: StarCoder2 3B, 7B, 15B): the Llama body's layer loop
and GQA attention (q/k/v/o_proj, full RoPE, one sliding_window on every layer or none), with
LayerNorms (norm_epsilon) for its norms, an ungated MLP (c_fc -> gelu_pytorch_tanh -> c_proj) and
use_bias on every projection. Attention is the one opaque op."""

from __future__ import annotations

import dataclasses
from typing import Any

from compiled_llm.models.config import MOE_KEYS, DecoderConfig
from compiled_llm.models.layers import DenseMLP, LayerNorm
from compiled_llm.models.llama import LlamaDecoderLayer, LlamaForCausalLM, LlamaModel


@dataclasses.dataclass
class Starcoder2Config(DecoderConfig):
    """DecoderConfig plus the LayerNorms' eps; use_bias sets every projection's bias."""

    layer_norm_eps: float = 1e-5

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> Starcoder2Config:
        """transformers' Starcoder2Config keys: norm_epsilon, use_bias, sliding_window (null:
        full attention; else every layer's window)."""
        hf = dict(hf_config)
        bias = bool(hf.get("use_bias", defaults.get("use_bias", True)))
        hf.update(attention_bias=bias, o_proj_bias=bias, mlp_bias=bias)
        base = super().from_hf(hf, **defaults)
        return dataclasses.replace(
            base, layer_norm_eps=hf.get("norm_epsilon", defaults.get("norm_epsilon", 1e-5)))


class Starcoder2DecoderLayer(LlamaDecoderLayer):
    """The Llama layer with LayerNorms and the c_fc / c_proj MLP (its residual add rides in the
    next norm, as the Llama layer's does)."""

    def __init__(self, cfg: Starcoder2Config, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.mlp = DenseMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act,
                            names=("c_fc", "c_proj"), bias=cfg.mlp_bias)
        self.input_layernorm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.post_attention_layernorm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)


class Starcoder2Model(LlamaModel):
    """The Llama body over StarCoder2 layers, its final norm a LayerNorm."""

    layer_cls = Starcoder2DecoderLayer

    def __init__(self, cfg: Starcoder2Config, max_len: int) -> None:
        super().__init__(cfg, max_len)
        self.norm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)


class Starcoder2ForCausalLM(LlamaForCausalLM):
    """StarCoder2 for causal LM: the Llama contract over Starcoder2Model (pipeline parallelism
    as Llama's, tensor parallelism too: c_fc by rows, c_proj by columns); the head tied to
    the embedding unless tie_word_embeddings is false. LoRA is refused by the
    gate/up/down_proj module it lacks."""

    model_cls = Starcoder2Model
    config_cls = Starcoder2Config
    # transformers' Starcoder2Config defaults (config.json may leave any of them out)
    hf_defaults = {"hidden_act": "gelu_pytorch_tanh", "norm_epsilon": 1e-5, "use_bias": True,
                   "max_position_embeddings": 4096, "sliding_window": None,
                   "tie_word_embeddings": True}
    # transformers' Starcoder2 never reads these: use_bias for every bias, its sliding_window
    # (when set) on every layer
    hf_unread = MOE_KEYS + ("use_sliding_window", "max_window_layers", "layer_types",
                            "attention_bias", "qkv_bias", "o_proj_bias", "mlp_bias",
                            "rms_norm_eps")
