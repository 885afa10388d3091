"""Rotary position embedding: the cos/sin table of every HF rope type (linear, dynamic,
llama3, YaRN, LongRoPE, proportional), the rotate-half, interleaved and partial rotations, and
the config of partial-rotary decoders."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from compiled_llm.models.config import DecoderConfig


def _scaled_inv_freq(inv_freq: torch.Tensor, scaling: dict, theta: float,
                     long: bool = False) -> torch.Tensor:
    kind = scaling.get("rope_type", "default")
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    if kind in ("default", "dynamic"):
        return inv_freq
    if kind == "yarn":
        return _yarn_inv_freq(inv_freq, theta, scaling)
    if kind == "longrope":  # per-frequency divisors: short within the original length
        divisors = scaling["long_factor" if long else "short_factor"]
        return inv_freq / torch.tensor(divisors, dtype=torch.float32)
    if kind == "proportional":  # the first partial_rotary_factor of the angles turn, then /factor
        angles = int(scaling.get("partial_rotary_factor", 1.0) * 2 * len(inv_freq) // 2)
        kept = torch.arange(len(inv_freq)) < angles
        return torch.where(kept, inv_freq, 0.0) / scaling.get("factor", 1.0)
    raise ValueError(f"rope_scaling.rope_type {kind!r} is not supported")


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    factor, original_len = scaling["factor"], scaling["original_max_position_embeddings"]
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original_len / low, inv_freq / factor, inv_freq)
    smooth = (original_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= original_len / high) & (wavelen <= original_len / low)
    return torch.where(medium, smoothed, scaled)


def _yarn_inv_freq(inv_freq: torch.Tensor, theta: float, scaling: dict) -> torch.Tensor:
    """YaRN: interpolated (divided by factor) low frequencies, extrapolated high ones, a linear
    ramp between the dimensions that turn beta_slow and beta_fast times in the original length
    (HF's _compute_yarn_parameters)."""
    dim, original = 2 * len(inv_freq), scaling["original_max_position_embeddings"]

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = correction_dim(scaling.get("beta_fast") or 32)
    high = correction_dim(scaling.get("beta_slow") or 1)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    return inv_freq / scaling["factor"] * ramp + inv_freq * (1 - ramp)


def _attention_factor(scaling: dict) -> float:
    """The factor YaRN and LongRoPE scale cos and sin by (1 for every other rope type)."""
    kind = scaling.get("rope_type")
    if kind not in ("yarn", "longrope"):
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = scaling["factor"]
    if kind == "longrope":
        original = scaling["original_max_position_embeddings"]
        return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    return mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)


def _dynamic_theta(theta: float, dim: int, scaling: dict, original_len: int,
                   max_len: int) -> float:
    # NTK-aware dynamic scaling is batch-dependent in HF; a static engine picks the base for its
    # max_model_len once, which equals HF's for every sequence within the original length.
    if scaling.get("rope_type") != "dynamic" or max_len <= original_len:
        return theta
    factor = scaling["factor"]
    return theta * ((factor * max_len / original_len) - (factor - 1)) ** (dim / (dim - 2))


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE with a precomputed float32 cos/sin table indexed by position.

    LongRoPE's rows from original_max_position_embeddings on use long_factor, as HF's decode
    does past that length; rows [long_rows_start, 2 * long_rows_start) use it from position 0,
    read by a request whose prompt is longer than that (HF rotates such a prompt, and all that
    follows it, with long_factor): the input batch offsets its positions (Request.long_rope)."""

    def __init__(self, cfg: DecoderConfig, max_len: int) -> None:
        super().__init__()
        dim, original_len, scaling = cfg.head_dim, cfg.max_position_embeddings, cfg.rope_scaling
        theta = _dynamic_theta(cfg.rope_theta, dim, scaling, original_len, max_len)
        inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
        positions = torch.arange(max(max_len, original_len), dtype=torch.float32)
        freqs = torch.outer(positions, _scaled_inv_freq(inv_freq, scaling, theta))
        self.long_rows_start = 0  # no long rows: positions are read as they are
        if scaling.get("rope_type") == "longrope":
            start = scaling["original_max_position_embeddings"]
            long_freqs = torch.outer(positions, _scaled_inv_freq(inv_freq, scaling, theta,
                                                                 long=True))
            freqs[start:] = long_freqs[start:]
            freqs, self.long_rows_start = torch.cat([freqs, long_freqs]), len(positions)
        cos_sin = torch.cat([freqs.cos(), freqs.sin()], -1) * _attention_factor(scaling)
        self.register_buffer("cos_sin", cos_sin, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, 1, D] of the positions: gathered once a step, shared by every layer
        (one gather instead of one per layer, which on a GPU is one kernel launch each)."""
        cos, sin = self.cos_sin[positions].unsqueeze(1).chunk(2, dim=-1)  # [T, 1, D/2]
        return torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)  # [T, 1, D]


def apply_rotary(q: torch.Tensor, k: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]):
    """Rotate q [T, H, D] and k [T, Hkv, D] by the (cos, sin) that RotaryEmbedding made."""
    cos, sin = rope
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(heads: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    cos, sin = cos.to(heads.dtype), sin.to(heads.dtype)
    first_half, second_half = heads.chunk(2, dim=-1)
    return heads * cos + torch.cat([-second_half, first_half], -1) * sin


def apply_rotary_interleaved(q: torch.Tensor, k: torch.Tensor,
                             rope: tuple[torch.Tensor, torch.Tensor]):
    """Rotate q [T, H, D] and k [T, Hkv, D] by RotaryEmbedding's (cos, sin) with dims paired
    (0, 1), (2, 3), ... (GPT-J's and Cohere's rotate_every_two, whose tables repeat_interleave
    each angle where RotaryEmbedding's repeat the half)."""
    cos, sin = (half[..., : half.shape[-1] // 2] for half in rope)  # [T, 1, D/2]
    return _rotate_pairs(q, cos, sin), _rotate_pairs(k, cos, sin)


def _rotate_pairs(heads: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    cos, sin = cos.to(heads.dtype), sin.to(heads.dtype)
    even, odd = heads.unflatten(-1, (-1, 2)).unbind(-1)  # [T, H, D/2] each
    return torch.stack([even * cos - odd * sin, odd * cos + even * sin], -1).flatten(-2)



def apply_partial_rotary(q: torch.Tensor, k: torch.Tensor,
                         rope: tuple[torch.Tensor, torch.Tensor], rotary_dim: int,
                         rotate=apply_rotary):
    """RoPE (a table of rotary_dim dims) on the leading rotary_dim dims of each head of
    q [T, H, D] and k [T, Hkv, D], applied by `rotate` (apply_rotary_interleaved: GPT-J's
    pairs); the other dims pass through."""
    head_dim = q.shape[-1]
    if rotary_dim == head_dim:
        return rotate(q, k, rope)
    dims = (rotary_dim, head_dim - rotary_dim)
    (q_rot, q_pass), (k_rot, k_pass) = q.split(dims, -1), k.split(dims, -1)
    q_rot, k_rot = rotate(q_rot, k_rot, rope)  # [T, H, rotary_dim]
    return torch.cat([q_rot, q_pass], -1), torch.cat([k_rot, k_pass], -1)


def check_partial_rotary(scaling: dict[str, Any], head_dim: int) -> None:
    """ValueError unless partial_rotary_factor turns an even, positive number of a head's
    dims and LongRoPE's factors are one per turned pair of them (or one in all)."""
    rotary_dim = int(head_dim * scaling.get("partial_rotary_factor", 1.0))
    if rotary_dim % 2 or rotary_dim <= 0:
        raise ValueError(f"partial_rotary_factor must turn an even number of dims, got "
                         f"{rotary_dim} of head_dim {head_dim}")
    for key in ("short_factor", "long_factor") if scaling["rope_type"] == "longrope" else ():
        if len(scaling[key]) not in (1, rotary_dim // 2):
            raise ValueError(f"rope_scaling.{key} must have rotary dims / 2 = "
                             f"{rotary_dim // 2} entries, got {len(scaling[key])}")


@dataclass
class PartialRotaryConfig(DecoderConfig):
    """DecoderConfig of a LayerNorm decoder (GPT-NeoX, Phi) whose RoPE turns the leading
    rotary_dim = head_dim * partial_rotary_factor dims of each head, for every rope type, as
    transformers' tables for them are built over those dims alone."""

    layer_norm_eps: float = 1e-5

    @property
    def rotary_dim(self) -> int:
        """The leading dims of a head that RoPE turns; the rest pass through."""
        return int(self.head_dim * self.rope_scaling.get("partial_rotary_factor", 1.0))

    @staticmethod
    def check_rotary(scaling: dict[str, Any], head_dim: int) -> None:
        """An even, positive rotary_dim; LongRoPE's factors one per turned pair of it;
        proportional RoPE (whose table pads the factor itself) refused."""
        if scaling["rope_type"] == "proportional":
            raise ValueError("rope_scaling.rope_type 'proportional' is not supported with a "
                             "partial_rotary_factor table")
        check_partial_rotary(scaling, head_dim)

    @classmethod
    def from_hf(cls, hf_config: dict[str, Any], **defaults: Any) -> PartialRotaryConfig:
        """DecoderConfig.from_hf plus layer_norm_eps."""
        base = super().from_hf(hf_config, **defaults)
        eps = hf_config.get("layer_norm_eps", defaults.get("layer_norm_eps", 1e-5))
        return replace(base, layer_norm_eps=eps)


def local_rotary_embedding(cfg, max_len: int) -> RotaryEmbedding:
    """The sliding layers' table: the default rope at cfg.local_rope_theta (Gemma 3 and 4,
    OLMo 3, Mellum)."""
    local = replace(cfg, rope_theta=cfg.local_rope_theta,
                                rope_scaling={"rope_type": "default"})
    return RotaryEmbedding(local, max_len)


def long_rope_after(cfg: DecoderConfig | None) -> int | None:
    """LongRoPE's original_max_position_embeddings: a prompt longer than it is rotated with
    long_factor from its first token (HF's rule); None for any other RoPE."""
    scaling = getattr(cfg, "rope_scaling", None) or {}
    return scaling.get("original_max_position_embeddings") if scaling.get(
        "rope_type") == "longrope" else None
