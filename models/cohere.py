"""Cohere decoder (CohereForCausalLM: Command-R, Aya): the Llama body with bias-free
LayerNorms, attention and the gated MLP in parallel off one input_layernorm
(x + attn(ln(x)) + mlp(ln(x))), RoPE on interleaved pairs of dims, optional per-head q/k
LayerNorms (use_qk_norm, a weight per head) and logits times logit_scale."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from compiled_llm.models.config import MOE_KEYS, WINDOW_KEYS, DecoderConfig
from compiled_llm.models.layers import GatedMLP, LayerNorm
from compiled_llm.models.llama import LlamaAttention, LlamaForCausalLM, LlamaModel
from compiled_llm.models.rotary import apply_rotary_interleaved


@dataclasses.dataclass
class CohereConfig(DecoderConfig):
    """DecoderConfig plus Cohere's layer_norm_eps, logit_scale and use_qk_norm."""

    layer_norm_eps: float = 1e-5
    logit_scale: float = 0.0625
    use_qk_norm: bool = False

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> CohereConfig:
        """The Llama keys, then Cohere's three (transformers' defaults where absent)."""
        base = super().from_hf(hf_config, **defaults)
        extra = {key: hf_config.get(key, defaults.get(key))
                 for key in ("layer_norm_eps", "logit_scale", "use_qk_norm")}
        for key in ("layer_norm_eps", "logit_scale"):
            if isinstance(extra[key], bool) or not isinstance(extra[key], (int, float)):
                raise ValueError(f"{key} must be a number for CohereForCausalLM, "
                                 f"got {extra[key]!r}")
        return dataclasses.replace(base, layer_norm_eps=float(extra["layer_norm_eps"]),
                                   logit_scale=float(extra["logit_scale"]),
                                   use_qk_norm=bool(extra["use_qk_norm"]))


class CohereHeadNorm(nn.Module):
    """A bias-free LayerNorm over each head's dims with a weight per head [heads, head_dim]
    (transformers' CohereLayerNorm of shape (heads, head_dim)), in float32."""

    def __init__(self, num_heads: int, head_dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num_heads, head_dim))
        self.eps = eps

    def forward(self, heads: torch.Tensor) -> torch.Tensor:
        """heads [T, H, D] -> the same shape and dtype."""
        normed = F.layer_norm(heads.float(), heads.shape[-1:], eps=self.eps)
        return (self.weight.float() * normed).to(heads.dtype)


class CohereAttention(LlamaAttention):
    """LlamaAttention with RoPE on interleaved pairs and, where use_qk_norm, per-head q/k
    LayerNorms before it."""

    def __init__(self, cfg: CohereConfig, layer_idx: int) -> None:
        super().__init__(cfg, layer_idx)
        self.use_qk_norm = cfg.use_qk_norm
        if cfg.use_qk_norm:
            self.q_norm = CohereHeadNorm(self.num_heads, self.head_dim, cfg.layer_norm_eps)
            self.k_norm = CohereHeadNorm(self.num_kv_heads, self.head_dim, cfg.layer_norm_eps)

    def qk_norm(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, H, D], k [T, Hkv, D] normed per head where use_qk_norm (a config constant)."""
        if self.use_qk_norm:
            return self.q_norm(q), self.k_norm(k)
        return q, k

    def rotate(self, q: torch.Tensor, k: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
        """RoPE on pairs (0, 1), (2, 3), ... of every head (transformers' rotate_every_two)."""
        return apply_rotary_interleaved(q, k, rope)


class CohereDecoderLayer(nn.Module):
    """x + attn(ln(x)) + mlp(ln(x)) in the Llama body's (hidden, residual) form: the next
    norm adds this layer's attention + MLP output to the residual stream."""

    attention_cls = CohereAttention

    def __init__(self, cfg: CohereConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = self.attention_cls(cfg, layer_idx)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, False, cfg.hidden_act)
        self.input_layernorm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, bias=False)

    def forward(self, hidden, residual, rope):
        """(hidden, residual) -> (attention + MLP output, residual stream without it)."""
        if residual is None:
            residual, normed = hidden, self.input_layernorm(hidden)
        else:
            normed, residual = self.input_layernorm(hidden, residual)
        return self.self_attn(normed, rope) + self.mlp(normed), residual


class CohereModel(LlamaModel):
    """The Llama body with Cohere layers and a bias-free final LayerNorm."""

    layer_cls = CohereDecoderLayer

    def __init__(self, cfg: CohereConfig, max_len: int) -> None:
        super().__init__(cfg, max_len)
        self.norm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, bias=False)


class CohereForCausalLM(LlamaForCausalLM):
    """Cohere for causal LM: the Llama contract over CohereModel, logits times logit_scale
    (the head tied to the embedding unless tie_word_embeddings is false). Tensor parallelism
    shards it as Llama (each rank keeps its heads' rows of the per-head q/k norm weights)."""

    model_cls = CohereModel
    config_cls = CohereConfig
    hf_defaults = {"rope_theta": 500000.0, "layer_norm_eps": 1e-5, "logit_scale": 0.0625,
                   "use_qk_norm": False, "tie_word_embeddings": True,
                   "max_position_embeddings": 8192}
    # transformers' Cohere never reads these: no window, no experts, o_proj biased as q/k/v,
    # the MLP never biased, LayerNorms (layer_norm_eps) only
    hf_unread = WINDOW_KEYS + MOE_KEYS + ("qkv_bias", "o_proj_bias", "mlp_bias", "rms_norm_eps")

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> logits [N, vocab], times logit_scale."""
        return self.lm_head(hidden) * self.config.logit_scale
