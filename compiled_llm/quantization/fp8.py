"""FP8 W8A8 linears: float8_e4m3fn weights with per-output-channel scales, per-token activations.
`quantize_model(model, "fp8")` swaps every nn.Linear but the LM head and MoE routers for an
Fp8Linear (routed experts: block FP8, moe_fp8.py), whose forward calls `quant_fp8_per_token`
(what the quant fusion passes match) and `compiled_llm::fp8_gemm`: `torch._scaled_mm` (row-wise
scales) on CUDA, a float32 matmul elsewhere."""

from __future__ import annotations

import torch
from torch import nn

from compiled_llm.passes.quant_ops import FP8_DTYPE, FP8_MAX, MIN_SCALE, quant_fp8_per_token

QUANTIZATIONS = (None, "fp8")


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] -> (w_q fp8 [N, K], scale f32 [N, 1]), weight ~= w_q * scale per row."""
    amax = weight.abs().amax(-1, keepdim=True).float()
    scale = (amax / FP8_MAX).clamp(min=MIN_SCALE)
    return (weight.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def _scaled_mm_ok(x_q: torch.Tensor, w_q: torch.Tensor) -> bool:
    # _scaled_mm wants CUDA and dims that are multiples of 16
    return x_q.is_cuda and x_q.shape[1] % 16 == 0 and w_q.shape[0] % 16 == 0


@torch.library.custom_op("compiled_llm::fp8_gemm", mutates_args=())
def fp8_gemm(q: torch.Tensor, x_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
             bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """(q * x_scale) [T, K] @ (w_q * w_scale).T [K, N] (+ bias) -> [T, N] in out_dtype."""
    if _scaled_mm_ok(q, w_q):
        return torch._scaled_mm(q, w_q.t(), scale_a=x_scale, scale_b=w_scale.t(), bias=bias,
                                out_dtype=out_dtype)
    out = (q.float() * x_scale) @ (w_q.float() * w_scale).t()
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


@fp8_gemm.register_fake
def _(q, x_scale, w_q, w_scale, bias, out_dtype):
    return q.new_empty((q.shape[0], w_q.shape[0]), dtype=out_dtype)


class Fp8Linear(nn.Module):
    """y = x W^T + b with W in FP8 (per-output-channel scale), x quantized per token."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w_q, scale = quantize_weight(linear.weight.detach())
        self.register_buffer("weight", w_q)  # [N, K] fp8
        self.register_buffer("weight_scale", scale)  # [N, 1] f32
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] -> [..., N] in x's dtype."""
        rows = x.reshape(-1, self.in_features)  # [T, K]
        x_q, x_scale = quant_fp8_per_token(rows)
        out = fp8_gemm(x_q, x_scale, self.weight, self.weight_scale, self.bias, x.dtype)
        return out.reshape(*x.shape[:-1], self.out_features)


def check_quantization(quantization: str | None) -> None:
    """ValueError naming the field unless quantization is None or "fp8"."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")


def _unquantized(model: nn.Module) -> set[int]:
    """ids of the linears that stay in the model's dtype: the LM head, and the routers (and
    shared-expert gates) of MoE blocks, whose top-k choice is sensitive to rounding."""
    keep = {id(getattr(model, "lm_head", None))}
    for module in model.modules():
        if hasattr(module, "experts"):
            keep.update(id(child) for child in module.children() if type(child) is nn.Linear)
    return keep


def quantize_model(model: nn.Module, quantization: str | None) -> nn.Module:
    """Apply `quantization` in place (None leaves the model as is); returns the model. fp8:
    linears per output channel (Fp8Linear), routed experts in 128x128 blocks (moe_fp8.py)."""
    check_quantization(quantization)
    if quantization is None:
        return model
    keep = _unquantized(model)
    targets = [(name, mod) for name, mod in model.named_modules()
               if type(mod) is nn.Linear and id(mod) not in keep]
    for name, linear in targets:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, Fp8Linear(linear))
    if getattr(getattr(model, "config", None), "moe", None) is not None:
        from compiled_llm.quantization.moe_fp8 import quantize_experts

        quantize_experts(model)
    return model
