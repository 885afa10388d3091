"""OLMo 1 decoder (OlmoForCausalLM: OLMo-1B-hf, OLMo-7B-0424-hf): the Llama body's layer loop
with non-parametric LayerNorms (no weight, no bias, eps 1e-5: transformers' OlmoLayerNorm),
q/k/v clamped to [-clip_qkv, clip_qkv] where clip_qkv is set, a SiLU-gated bias-free MLP and a
tied or untied head. Attention is the one opaque op."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS, DecoderConfig
from compiled_llm.models.layers import LayerNorm
from compiled_llm.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
)


@dataclasses.dataclass
class OlmoConfig(DecoderConfig):
    """DecoderConfig plus clip_qkv (None: q, k and v unclamped)."""

    clip_qkv: float | None = None

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> OlmoConfig:
        """The Llama keys, then clip_qkv (a positive number or null)."""
        base = super().from_hf(hf_config, **defaults)
        clip = hf_config.get("clip_qkv")
        if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float))
                                 or clip <= 0):
            raise ValueError(f"clip_qkv must be a positive number or null, got {clip!r}")
        return dataclasses.replace(base, clip_qkv=None if clip is None else float(clip))


def clip_qkv(qkv: tuple[torch.Tensor, ...], clip: float | None) -> tuple[torch.Tensor, ...]:
    """Each of q, k, v clamped to [-clip, clip]; unchanged where clip is None."""
    if clip is None:
        return qkv
    return tuple(x.clamp(-clip, clip) for x in qkv)


class OlmoAttention(LlamaAttention):
    """LlamaAttention with q, k and v clamped to [-clip_qkv, clip_qkv] before RoPE."""

    def __init__(self, cfg: OlmoConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.clip_qkv = cfg.clip_qkv

    def qkv(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [T, H, D], k and v [T, Hkv, D], clamped where clip_qkv is set."""
        return clip_qkv(super().qkv(hidden), self.clip_qkv)


class _Float32LayerNorm(nn.LayerNorm):
    """nn.LayerNorm computed in float32 and cast back."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., dim] -> the same shape and dtype."""
        return super().forward(hidden.float()).to(hidden.dtype)


class OlmoLayerNorm(LayerNorm, _Float32LayerNorm):
    """transformers' OlmoLayerNorm: no weight, no bias, eps 1e-5, in float32; LayerNorm's
    residual form (its super().forward is the float32 one)."""

    def __init__(self, dim: int) -> None:
        super().__init__(dim, eps=1e-5, elementwise_affine=False)


class OlmoDecoderLayer(LlamaDecoderLayer):
    """The Llama layer with OlmoAttention and non-parametric LayerNorms."""

    attention_cls = OlmoAttention

    def __init__(self, cfg: OlmoConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.input_layernorm = OlmoLayerNorm(cfg.hidden_size)
        self.post_attention_layernorm = OlmoLayerNorm(cfg.hidden_size)


class OlmoModel(LlamaModel):
    """The Llama body over OLMo layers, its final norm non-parametric too."""

    layer_cls = OlmoDecoderLayer

    def __init__(self, cfg: OlmoConfig, max_len: int) -> None:
        super().__init__(cfg, max_len)
        self.norm = OlmoLayerNorm(cfg.hidden_size)


class OlmoForCausalLM(LlamaForCausalLM):
    """OLMo for causal LM: the Llama contract over OlmoModel; tensor and pipeline parallelism
    and LoRA as Llama's (the clamp is per element)."""

    model_cls = OlmoModel
    config_cls = OlmoConfig
    # transformers' Olmo never reads these: no window, no experts, o_proj biased as q/k/v,
    # the MLP never biased, LayerNorms of a fixed eps
    hf_unread = WINDOW_KEYS + MOE_KEYS + ("qkv_bias", "o_proj_bias", "mlp_bias", "rms_norm_eps")
