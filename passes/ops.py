"""Custom ops the fusion passes emit: RMSNorm, residual add + RMSNorm and SiLU·mul, one node each.

Each op's body is its reference decomposition (the exact arithmetic of the models' helpers), which
the clean-up tail inlines back before Inductor so that Inductor emits one kernel per op site.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

LIB = "compiled_llm"


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The models' RMSNorm: float32 statistics, cast back, then scaled by weight."""
    dtype = x.dtype
    x_f32 = x.float()
    x_f32 = x_f32 * torch.rsqrt(x_f32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x_f32.to(dtype)


def fused_add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                           eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual)."""
    summed = x + residual
    return rms_norm_ref(summed, weight, eps), summed


def silu_and_mul_ref(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, as the gated MLP writes it."""
    return F.silu(gate) * up


def _norm_out(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype))


@torch.library.custom_op(f"{LIB}::rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., D], weight [D] -> [..., D]."""
    return rms_norm_ref(x, weight, eps)


@rms_norm.register_fake
def _rms_norm_fake(x, weight, eps):
    return _norm_out(x, weight)


@torch.library.custom_op(f"{LIB}::fused_add_rms_norm", mutates_args=())
def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual [..., D] -> (normed [..., D], x + residual)."""
    normed, summed = fused_add_rms_norm_ref(x, residual, weight, eps)
    return normed, summed


@fused_add_rms_norm.register_fake
def _fused_add_rms_norm_fake(x, residual, weight, eps):
    summed = torch.empty_like(x + residual)
    return _norm_out(summed, weight), summed


@torch.library.custom_op(f"{LIB}::silu_and_mul", mutates_args=())
def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate, up [T, I] -> silu(gate) * up [T, I]."""
    return silu_and_mul_ref(gate, up)


@silu_and_mul.register_fake
def _silu_and_mul_fake(gate, up):
    return torch.empty_like(gate * up)
