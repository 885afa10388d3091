"""FP8 (float8_e4m3fn) custom ops: per-token dynamic activation quant and its fused producers.

`quant_fp8_per_token` is what an FP8 linear calls on its input; the quant fusion passes replace
a norm or SiLU·mul feeding it by one of the fused ops here, whose bodies the clean-up tail inlines
so that Inductor emits the producer and the quantization as one kernel.
"""

from __future__ import annotations

import torch

from compiled_llm.passes.ops import LIB, fused_add_rms_norm_ref, rms_norm_ref, silu_and_mul_ref

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8_DTYPE).max
MIN_SCALE = 1.0 / (FP8_MAX * 512.0)  # keeps all-zero rows finite


def quant_fp8_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] -> (q [T, K] fp8, scale [T, 1] float32) with x ~= q * scale, per row."""
    amax = x.abs().amax(-1, keepdim=True).float()
    scale = (amax / FP8_MAX).clamp(min=MIN_SCALE)
    quantized = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return quantized, scale


def _quant_fake(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (x.new_empty(x.shape, dtype=FP8_DTYPE),
            x.new_empty((*x.shape[:-1], 1), dtype=torch.float32))


@torch.library.custom_op(f"{LIB}::quant_fp8_per_token", mutates_args=())
def quant_fp8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] -> (q fp8 [T, K], scale f32 [T, 1])."""
    return quant_fp8_ref(x)


@quant_fp8_per_token.register_fake
def _(x):
    return _quant_fake(x)


def rms_norm_quant_fp8_ref(x, weight, eps):
    """quant_fp8(rms_norm(x))."""
    return quant_fp8_ref(rms_norm_ref(x, weight, eps))


def fused_add_rms_norm_quant_fp8_ref(x, residual, weight, eps):
    """(*quant_fp8(rms_norm(x + residual)), x + residual)."""
    normed, summed = fused_add_rms_norm_ref(x, residual, weight, eps)
    return (*quant_fp8_ref(normed), summed)


def silu_and_mul_quant_fp8_ref(gate, up):
    """quant_fp8(silu(gate) * up)."""
    return quant_fp8_ref(silu_and_mul_ref(gate, up))


@torch.library.custom_op(f"{LIB}::rms_norm_quant_fp8", mutates_args=())
def rms_norm_quant_fp8(x: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, D] -> (q fp8 [T, D], scale [T, 1])."""
    return rms_norm_quant_fp8_ref(x, weight, eps)


@rms_norm_quant_fp8.register_fake
def _(x, weight, eps):
    return _quant_fake(x)


@torch.library.custom_op(f"{LIB}::fused_add_rms_norm_quant_fp8", mutates_args=())
def fused_add_rms_norm_quant_fp8(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x, residual [T, D] -> (q fp8 [T, D], scale [T, 1], x + residual)."""
    quantized, scale, summed = fused_add_rms_norm_quant_fp8_ref(x, residual, weight, eps)
    return quantized, scale, summed


@fused_add_rms_norm_quant_fp8.register_fake
def _(x, residual, weight, eps):
    summed = torch.empty_like(x + residual)
    return (*_quant_fake(summed), summed)


@torch.library.custom_op(f"{LIB}::silu_and_mul_quant_fp8", mutates_args=())
def silu_and_mul_quant_fp8(gate: torch.Tensor,
                           up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """gate, up [T, I] -> (q fp8 [T, I], scale [T, 1])."""
    return silu_and_mul_quant_fp8_ref(gate, up)


@silu_and_mul_quant_fp8.register_fake
def _(gate, up):
    return _quant_fake(torch.empty_like(gate * up))
