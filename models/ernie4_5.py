"""ERNIE 4.5 dense decoder (Ernie4_5ForCausalLM: baidu/ERNIE-4.5-0.3B-PT): the Llama layout with
RoPE on interleaved pairs of dims (0, 1), (2, 3), ... rotated in float32, use_bias on every
q/k/v/o and gate/up/down projection, and a tied head by default."""

from __future__ import annotations

from typing import Any

import torch

from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS, DecoderConfig
from compiled_llm.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
)
from compiled_llm.models.rotary import apply_rotary_interleaved


class Ernie4_5Config(DecoderConfig):
    """DecoderConfig whose every projection bias is use_bias."""

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> Ernie4_5Config:
        """transformers' Ernie4_5Config keys: use_bias for q/k/v/o and the MLP alike."""
        hf = dict(hf_config)
        bias = bool(hf.get("use_bias", defaults.get("use_bias", False)))
        hf.update(attention_bias=bias, o_proj_bias=bias, mlp_bias=bias)
        return super().from_hf(hf, **defaults)


class Ernie4_5Attention(LlamaAttention):
    """LlamaAttention with RoPE on interleaved pairs, in float32 as transformers rotates."""

    def rotate(self, q: torch.Tensor, k: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """RoPE on pairs (0, 1), (2, 3), ... of q and k upcast to float32, cast back."""
        dtype = q.dtype
        q, k = apply_rotary_interleaved(q.float(), k.float(), rope)
        return q.to(dtype), k.to(dtype)


class Ernie4_5DecoderLayer(LlamaDecoderLayer):
    """The Llama layer with Ernie4_5Attention."""

    attention_cls = Ernie4_5Attention


class Ernie4_5Model(LlamaModel):
    """The Llama body over ERNIE 4.5 layers."""

    layer_cls = Ernie4_5DecoderLayer


class Ernie4_5ForCausalLM(LlamaForCausalLM):
    """ERNIE 4.5 for causal LM: the Llama contract over Ernie4_5Model (tensor and pipeline
    parallelism and LoRA as Llama's: its biases are on the projections Llama shards)."""

    model_cls = Ernie4_5Model
    config_cls = Ernie4_5Config
    # transformers' Ernie4_5Config defaults (config.json may leave any of them out)
    hf_defaults = {"head_dim": 128, "num_key_value_heads": 2, "rope_theta": 500000.0,
                   "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
                   "use_bias": False, "tie_word_embeddings": True}
    # transformers' ERNIE 4.5 never reads these: no window, no experts, use_bias for every bias
    hf_unread = WINDOW_KEYS + MOE_KEYS + ("attention_bias", "qkv_bias", "o_proj_bias",
                                          "mlp_bias")
