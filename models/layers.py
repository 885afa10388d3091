"""Shared building blocks in plain torch: RMSNorm, rotary embedding, gated MLP, embeddings.

These are the exact shapes the compiler's fusion passes match (rms_norm, residual add + norm,
silu(gate) * up). Write new models on them; a different spelling silently loses the fusion.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from compiled_llm.models.config import DecoderConfig


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32 and cast back, as the HF reference does."""
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dtype)


class RMSNorm(nn.Module):
    """RMSNorm; called with a residual it adds first and returns (normed, new residual)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return rms_norm(x, self.weight, self.eps)
        x = x + residual
        return rms_norm(x, self.weight, self.eps), x


def _scaled_inv_freq(inv_freq: torch.Tensor, scaling: dict, max_len: int) -> torch.Tensor:
    kind = scaling.get("rope_type", "default")
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        factor, old = scaling["factor"], scaling["original_max_position_embeddings"]
        low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        return torch.where(medium, smoothed, scaled)
    if kind in ("default", "dynamic"):
        return inv_freq
    raise ValueError(f"rope_scaling.rope_type {kind!r} is not supported")


def _dynamic_theta(theta: float, dim: int, scaling: dict, orig: int, max_len: int) -> float:
    # NTK-aware dynamic scaling is batch-dependent in HF; a static engine picks the base for its
    # max_model_len once, which equals HF's for every sequence within the original length.
    if scaling.get("rope_type") != "dynamic" or max_len <= orig:
        return theta
    factor = scaling["factor"]
    return theta * ((factor * max_len / orig) - (factor - 1)) ** (dim / (dim - 2))


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE with a precomputed float32 cos/sin table indexed by position."""

    def __init__(self, cfg: DecoderConfig, max_len: int) -> None:
        super().__init__()
        dim, orig = cfg.head_dim, cfg.max_position_embeddings
        theta = _dynamic_theta(cfg.rope_theta, dim, cfg.rope_scaling, orig, max_len)
        inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
        inv_freq = _scaled_inv_freq(inv_freq, cfg.rope_scaling, max_len)
        freqs = torch.outer(torch.arange(max(max_len, orig), dtype=torch.float32), inv_freq)
        self.register_buffer("cos_sin", torch.cat([freqs.cos(), freqs.sin()], -1), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, 1, D] of the positions: gathered once a step, shared by every layer
        (one gather instead of one per layer, which on a GPU is one kernel launch each)."""
        cos, sin = self.cos_sin[positions].unsqueeze(1).chunk(2, dim=-1)  # [T, 1, D/2]
        return torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)  # [T, 1, D]


def apply_rotary(q: torch.Tensor, k: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
    """Rotate q [T, H, D] and k [T, Hkv, D] by the (cos, sin) that RotaryEmbedding made."""
    cos, sin = rope
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


class GatedMLP(nn.Module):
    """down_proj(silu(gate_proj(x)) * up_proj(x))."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LMHead(nn.Linear):
    """Output projection; shares the embedding's weight when tie_word_embeddings is set."""

    def __init__(self, cfg: DecoderConfig, embed: nn.Embedding) -> None:
        super().__init__(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.weight = embed.weight
