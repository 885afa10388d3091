"""W8A8 linears for prequantized checkpoints: INT8 (per-channel weights, dynamic per-token or
static per-tensor activations, `torch._int_mm` on CUDA), static per-tensor FP8 activations, and
block FP8 (128x128 weight blocks, activations per token and group of 128). Each op has a torch
reference that CPU runs and a fake impl so that it traces fullgraph.
"""

from __future__ import annotations

import torch

from compiled_llm.passes.quant_ops import FP8_DTYPE, FP8_MAX, MIN_SCALE, quant_fp8_per_token
from compiled_llm.quantization.fp8 import fp8_gemm
from compiled_llm.quantization.fp8_groups import FP8_BLOCK, quant_fp8_groups
from compiled_llm.quantization.row_fused import RowFusedLinear

INT8_MAX = 127.0


def quant_int8_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] -> (q int8 [T, K], scale f32 [T, 1]), x ~= q * scale per row (symmetric)."""
    scale = (x.abs().amax(-1, keepdim=True).float() / INT8_MAX).clamp(min=MIN_SCALE)
    return (x.float() / scale).round().clamp(-128, 127).to(torch.int8), scale


@torch.library.custom_op("compiled_llm::quant_int8_per_token", mutates_args=())
def quant_int8_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] -> (q int8 [T, K], scale f32 [T, 1])."""
    return quant_int8_ref(x)


@quant_int8_per_token.register_fake
def _(x):
    return x.new_empty(x.shape, dtype=torch.int8), x.new_empty((x.shape[0], 1),
                                                                dtype=torch.float32)


def quant_int8_static_ref(x: torch.Tensor, scale: torch.Tensor,
                          zero_point: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, K] with a calibrated per-tensor scale [1] (and zero point [1]) -> q int8 [T, K] =
    clamp(round(x / scale) (+ zero_point), -128, 127), as vLLM's static int8 quant."""
    q = (x.float() / scale.float()).round()
    q = q if zero_point is None else q + zero_point.float()
    return q.clamp(-128, 127).to(torch.int8)


@torch.library.custom_op("compiled_llm::int8_gemm", mutates_args=())
def int8_gemm(q: torch.Tensor, x_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
              bias: torch.Tensor | None, out_dtype: torch.dtype,
              x_zero_point: torch.Tensor | None = None) -> torch.Tensor:
    """(q * x_scale) [T, K] @ (w_q * w_scale).T [K, N] (+ bias) -> [T, N] in out_dtype. q is
    int8 with per-token scales [T, 1], or the float activations with a static per-tensor scale
    [1] (and zero point: `bias` then holds its correction), quantized here, so that siblings
    reading one input still share every non-row arg (HorizontalGemmFusionPass)."""
    if q.is_floating_point():
        q = quant_int8_static_ref(q, x_scale, x_zero_point)
    if q.is_cuda and q.shape[1] % 8 == 0 and w_q.shape[0] % 8 == 0:
        rows = q.shape[0]
        padded = q if rows > 16 else torch.nn.functional.pad(q, (0, 0, 0, 17 - rows))
        acc = torch._int_mm(padded, w_q.t())[:rows].float()  # _int_mm wants M > 16
    else:
        acc = q.float() @ w_q.float().t()  # CPU reference: exact products, float32 sums
    out = acc * x_scale * w_scale.t()
    return (out if bias is None else out + bias.float()).to(out_dtype)


@int8_gemm.register_fake
def _(q, x_scale, w_q, w_scale, bias, out_dtype, x_zero_point=None):
    return q.new_empty((q.shape[0], w_q.shape[0]), dtype=out_dtype)


@torch.library.custom_op("compiled_llm::quant_fp8_static", mutates_args=())
def quant_fp8_static(x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] with a calibrated per-tensor scale [1] -> (q fp8 [T, K], scale f32 [T, 1])."""
    scale = scale.float().reshape(1, 1)
    q = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale.repeat(x.shape[0], 1)  # a copy: outputs must not alias inputs


@quant_fp8_static.register_fake
def _(x, scale):
    return x.new_empty(x.shape, dtype=FP8_DTYPE), x.new_empty((x.shape[0], 1),
                                                               dtype=torch.float32)


def fp8_block_reference(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                        bias: torch.Tensor | None) -> torch.Tensor:
    """Activations quantized per token and 128 inputs, times the block-scaled weight."""
    x_q, x_scale = quant_fp8_groups(x)
    x_deq = x_q.float() * x_scale.repeat_interleave(FP8_BLOCK, dim=1)
    w_deq = weight.float() * weight_scale.repeat_interleave(FP8_BLOCK, dim=1)
    out = x_deq @ w_deq.t()
    return (out if bias is None else out + bias.float()).to(x.dtype)


@torch.library.custom_op("compiled_llm::fp8_block_gemm", mutates_args=())
def fp8_block_gemm(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                   bias: torch.Tensor | None) -> torch.Tensor:
    """x [T, K] @ (weight e4m3 [N, K] * weight_scale [N, K/128]).T (+ bias) -> [T, N]."""
    if x.is_cuda:
        from compiled_llm.quantization.kernels.fp8_block import fp8_block_gemm_triton

        out = fp8_block_gemm_triton(x, weight, weight_scale)
        return out if bias is None else out + bias.to(out.dtype)
    return fp8_block_reference(x, weight, weight_scale, bias)


@fp8_block_gemm.register_fake
def _(x, weight, weight_scale, bias):
    return x.new_empty((x.shape[0], weight.shape[0]))


class _W8A8Linear(RowFusedLinear):
    """weight [N, K] and per-row weight_scale [N, *] buffers, shared forward plumbing."""

    row_tensors = ("weight", "weight_scale")

    def __init__(self, weight: torch.Tensor, weight_scale: torch.Tensor,
                 bias: torch.Tensor | None) -> None:
        super().__init__(weight.shape[1], weight.shape[0], bias)
        self.register_buffer("weight", weight.contiguous())
        self.register_buffer("weight_scale", weight_scale.float().contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] -> [..., N] in x's dtype."""
        rows = x.reshape(-1, self.in_features)
        out = self.gemm(rows, self.tensor("weight"), self.tensor("weight_scale"))
        return out.reshape(*x.shape[:-1], self.out_features)


class Int8Linear(_W8A8Linear):
    """INT8 weights per output channel [N, 1], activations quantized per token."""

    def gemm(self, rows, weight, weight_scale):
        """quant_int8_per_token, then int8_gemm."""
        q, x_scale = quant_int8_per_token(rows)
        return int8_gemm(q, x_scale, weight, weight_scale, self.bias_rows(), rows.dtype)


class StaticInt8Linear(_W8A8Linear):
    """INT8 weights per output channel [N, 1] and a calibrated per-tensor input_scale [1], and
    for asymmetric activations an input_zero_point [1]: x ~= (q - zp) * scale, so the gemm
    subtracts zp * scale * weight_scale * (sum of the weight row) per output, vLLM's azp term,
    folded here into a float32 bias. Siblings fuse only with equal scales and zero points."""

    shared_tensors = ("input_scale", "input_zero_point")

    def __init__(self, weight, weight_scale, input_scale, input_zero_point, bias) -> None:
        input_scale = input_scale.float().reshape(1)
        if input_zero_point is not None:
            input_zero_point = input_zero_point.float().reshape(1)
            row_sums = weight.sum(1, dtype=torch.int64).double()  # exact
            azp = input_zero_point.double() * input_scale.double() * row_sums
            correction = azp * weight_scale.double().reshape(-1)
            bias = ((0.0 if bias is None else bias.double()) - correction).float()
        super().__init__(weight, weight_scale, bias)
        self.register_buffer("input_scale", input_scale)
        self.register_buffer("input_zero_point", input_zero_point)

    def gemm(self, rows, weight, weight_scale):
        """int8_gemm on the float rows: it quantizes them with the static scale (and zp)."""
        return int8_gemm(rows, self.tensor("input_scale"), weight, weight_scale,
                         self.bias_rows(), rows.dtype, self.tensor("input_zero_point"))


class StaticFp8Linear(_W8A8Linear):
    """FP8 weights with per-row scales [N, 1] and a calibrated per-tensor input_scale."""

    shared_tensors = ("input_scale",)

    def __init__(self, weight, weight_scale, input_scale, bias) -> None:
        super().__init__(weight, weight_scale, bias)
        self.register_buffer("input_scale", input_scale.float().reshape(1))

    def gemm(self, rows, weight, weight_scale):
        """quant_fp8_static with the input scale, then fp8_gemm."""
        q, x_scale = quant_fp8_static(rows, self.tensor("input_scale"))
        return fp8_gemm(q, x_scale, weight, weight_scale, self.bias_rows(), rows.dtype)


class BlockFp8Linear(_W8A8Linear):
    """FP8 weights in 128x128 blocks, scales expanded per row [N, K/128]."""

    def gemm(self, rows, weight, weight_scale):
        """fp8_block_gemm (activations quantized inside, per token and 128 inputs)."""
        return fp8_block_gemm(rows, weight, weight_scale, self.bias_rows())


class DynamicFp8Linear(_W8A8Linear):
    """FP8 weights with per-row scales [N, 1], activations quantized per token (the ops that
    the quant fusion passes match)."""

    def gemm(self, rows, weight, weight_scale):
        """quant_fp8_per_token, then fp8_gemm."""
        q, x_scale = quant_fp8_per_token(rows)
        return fp8_gemm(q, x_scale, weight, weight_scale, self.bias_rows(), rows.dtype)
