"""Shared building blocks in plain torch: RMSNorm, LayerNorm, gated and dense MLPs, LM head.

These are the exact shapes the compiler's fusion passes match (rms_norm, residual add + norm,
silu(gate) * up). Write new models on them; a different spelling silently loses the fusion.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from compiled_llm.models.config import DecoderConfig

# parent module name -> (fused name, children that read the parent's same input, in order)
SIBLINGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "self_attn": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
    "attn": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),  # GPT-J's (GPT-2's c_attn: no match)
    "mlp": ("gate_up_proj", ("gate_proj", "up_proj")),
    "feed_forward": ("gate_up_proj", ("gate_proj", "up_proj")),  # Llama 4's dense MLPs
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


class SoftCappedLogits:
    """A CausalLM mixin: logits tanh soft-capped as tanh(logits / cap) * cap where the model's
    `softcap` is set (Gemma 2-4, NanoChat), the plain head where it is None or 0."""

    softcap: float | None = None

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> logits [N, vocab], soft-capped where set."""
        logits = self.lm_head(hidden)
        if not self.softcap:
            return logits
        return torch.tanh(logits / self.softcap) * self.softcap


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


def param_dtype(module: nn.Module, name: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype module's parameter `name` is held in within a `dtype` model: float32 where the
    module lists it in `float32_params` (the routers transformers keeps in float32)."""
    return torch.float32 if name in getattr(module, "float32_params", ()) else dtype


def cast_model(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """model.to(dtype), then each module's `float32_params` back to float32, so the loader's
    copy holds a checkpoint's float32 router exactly (not rounded to dtype first)."""
    model.to(dtype=dtype)
    for module in model.modules():
        for name in getattr(module, "float32_params", ()):
            param = module._parameters.get(name)
            if param is not None and param.is_floating_point():
                param.data = param.data.float()
    return model
