"""Shared building blocks in plain torch: RMSNorm, rotary embedding, gated MLP, embeddings.

These are the exact shapes the compiler's fusion passes match (rms_norm, residual add + norm,
silu(gate) * up). Write new models on them; a different spelling silently loses the fusion.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from compiled_llm.models.config import DecoderConfig

# parent module name -> (fused name, children that read the parent's same input, in order)
SIBLINGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "self_attn": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
    "attn": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),  # GPT-J's (GPT-2's c_attn: no match)
    "mlp": ("gate_up_proj", ("gate_proj", "up_proj")),
    "shared_expert": ("gate_up_proj", ("gate_proj", "up_proj")),  # MoE blocks (Qwen2-MoE)
}


def rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32 and cast back, as the HF reference does."""
    dtype = hidden.dtype
    hidden_f32 = hidden.float()
    hidden_f32 = hidden_f32 * torch.rsqrt(hidden_f32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * hidden_f32.to(dtype)


class RMSNorm(nn.Module):
    """RMSNorm; called with a residual it adds first and returns (normed, new residual)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None = None):
        """norm(hidden), or (norm(hidden + residual), hidden + residual)."""
        if residual is None:
            return rms_norm(hidden, self.weight, self.eps)
        hidden = hidden + residual
        return rms_norm(hidden, self.weight, self.eps), hidden


class LayerNorm(nn.LayerNorm):
    """nn.LayerNorm with RMSNorm's residual form, for a LayerNorm decoder on the Llama body's
    layer loop (StarCoder2, StableLM): called with a residual it adds first and returns
    (normed, new residual)."""

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None = None):
        """norm(hidden), or (norm(hidden + residual), hidden + residual)."""
        if residual is None:
            return super().forward(hidden)
        hidden = hidden + residual
        return super().forward(hidden), hidden


def add_and_norm(norm: nn.Module, hidden: torch.Tensor, residual: torch.Tensor | None):
    """(norm(hidden + residual), hidden + residual) through a residual-form norm (RMSNorm,
    LayerNorm); the first layer's residual is None: (norm(hidden), hidden)."""
    if residual is None:
        return norm(hidden), hidden
    return norm(hidden, residual)


class Float32ScaleRMSNorm(nn.Module):
    """RMSNorm that scales in float32 and casts after: x * rsqrt(mean(x^2) + eps) *
    (offset + weight) (Gemma's weight is an offset from 1, OLMo 2's is not). No fusion pass
    matches it; RMSNorm (cast, then scaled) is Llama's."""

    def __init__(self, dim: int, eps: float, offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim) if offset else torch.ones(dim))
        self.eps, self.offset = eps, offset

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., dim] -> the same shape and dtype."""
        hidden_f32 = hidden.float()
        normed = hidden_f32 * torch.rsqrt(hidden_f32.pow(2).mean(-1, keepdim=True) + self.eps)
        weight = self.weight.float()
        scaled = normed * (self.offset + weight) if self.offset else weight * normed
        return scaled.to(hidden.dtype)


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
    does past that length (HF also rotates a whole longer prompt with it: max_model_len's
    default stays at that length, config.model_len_bounds)."""

    def __init__(self, cfg: DecoderConfig, max_len: int) -> None:
        super().__init__()
        dim, original_len, scaling = cfg.head_dim, cfg.max_position_embeddings, cfg.rope_scaling
        theta = _dynamic_theta(cfg.rope_theta, dim, scaling, original_len, max_len)
        inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
        positions = torch.arange(max(max_len, original_len), dtype=torch.float32)
        freqs = torch.outer(positions, _scaled_inv_freq(inv_freq, scaling, theta))
        if scaling.get("rope_type") == "longrope":
            start = scaling["original_max_position_embeddings"]
            long_inv_freq = _scaled_inv_freq(inv_freq, scaling, theta, long=True)
            freqs[start:] = torch.outer(positions[start:], long_inv_freq)
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


ACTIVATIONS = {  # transformers' ACT2FN spellings (config.HIDDEN_ACTS) -> the function
    "silu": F.silu, "swish": F.silu, "gelu": F.gelu, "gelu_python": F.gelu,
    **dict.fromkeys(("gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python_tanh",
                     "gelu_accurate"), functools.partial(F.gelu, approximate="tanh")),
    "gelu_10": lambda x: F.gelu(x).clamp(-10, 10),
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "relu": F.relu, "relu2": lambda x: F.relu(x).square(), "relu6": F.relu6,
    "leaky_relu": F.leaky_relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "mish": F.mish,
    "linear": lambda x: x,
}


class GatedMLP(nn.Module):
    """down_proj(act(gate_proj(x)) * up_proj(x)), SiLU unless `act` (hidden_act) says;
    biased linears where `bias` (mlp_bias)."""

    def __init__(self, hidden: int, intermediate: int, bias: bool = False,
                 act: str = "silu") -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.up_proj = nn.Linear(hidden, intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)
        self.act_fn = ACTIVATIONS[act]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> [T, hidden]."""
        return self.down_proj(self.act_fn(self.gate_proj(hidden)) * self.up_proj(hidden))


class LMHead(nn.Linear):
    """Output projection; shares the embedding's weight when tie_word_embeddings is set."""

    def __init__(self, cfg: DecoderConfig, embed: nn.Embedding) -> None:
        super().__init__(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.weight = embed.weight


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


class DenseMLP(nn.Module):
    """Ungated MLP, down(act(up(x))) with linears named as the checkpoint names them
    (`names`: GPT-NeoX's dense_h_to_4h / dense_4h_to_h, Phi's fc1 / fc2), biased unless
    `bias` is false (StarCoder2's use_bias)."""

    def __init__(self, hidden: int, intermediate: int, act: str = "gelu",
                 names: tuple[str, str] = ("fc1", "fc2"), bias: bool = True) -> None:
        super().__init__()
        self.up_name, self.down_name = names
        setattr(self, self.up_name, nn.Linear(hidden, intermediate, bias=bias))
        setattr(self, self.down_name, nn.Linear(intermediate, hidden, bias=bias))
        self.act_fn = ACTIVATIONS[act]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, hidden] -> [T, hidden]."""
        up, down = getattr(self, self.up_name), getattr(self, self.down_name)
        return down(self.act_fn(up(hidden)))


class CausalLM(nn.Module):
    """The model contract over a decoder body held at `body_name` (HF's base_model_prefix):
    forward(input_ids [T], positions [T]) -> its hidden [T, hidden]; compute_logits -> lm_head;
    checkpoint names map as they are but for ignored_weights (skipped)."""

    body_name = "model"
    ignored_weights: tuple[str, ...] = ()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """input_ids, positions [T] -> hidden states [T, hidden] (no logits)."""
        return getattr(self, self.body_name)(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> logits [N, vocab]."""
        return self.lm_head(hidden)

    @classmethod
    def weight_name(cls, hf_name: str) -> str | None:
        """Our parameter name for a checkpoint tensor name (the identity), or None to skip."""
        return None if hf_name.endswith(cls.ignored_weights) else hf_name
