"""W4A16 linears: 4-bit weights kept packed on the device (canonical layout of packing.py),
activations in the model dtype. `compiled_llm::w4a16_gemm` runs the Triton kernel on CUDA and
a torch reference (dequantize, then matmul) elsewhere; its fake impl lets it trace fullgraph.
"""

from __future__ import annotations

import torch

from compiled_llm.quantization.packing import dequantize_int4
from compiled_llm.quantization.row_fused import RowFusedLinear


def w4a16_reference(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                    zeros: torch.Tensor, perm: torch.Tensor | None, bias: torch.Tensor | None,
                    group_size: int) -> torch.Tensor:
    """x[:, perm] [T, K] @ W.T (+ bias), W dequantized in x's dtype -> [T, N]."""
    if perm is not None:
        x = x.index_select(1, perm)
    weight = dequantize_int4(qweight, scales.to(x.dtype), zeros, group_size)
    out = x @ weight.t()
    return out if bias is None else out + bias.to(out.dtype)


@torch.library.custom_op("compiled_llm::w4a16_gemm", mutates_args=())
def w4a16_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
               zeros: torch.Tensor, perm: torch.Tensor | None, bias: torch.Tensor | None,
               group_size: int) -> torch.Tensor:
    """x [T, K] @ dequant(qweight [N, K/8], scales, zeros [N, K/group]).T (+ bias) -> [T, N];
    `perm` [K] (GPTQ act-order) reorders x's columns first."""
    if not x.is_cuda:
        return w4a16_reference(x, qweight, scales, zeros, perm, bias, group_size)
    from compiled_llm.quantization.kernels.w4a16 import w4a16_gemm_triton

    if perm is not None:
        x = x.index_select(1, perm)
    out = w4a16_gemm_triton(x, qweight, scales.to(x.dtype), zeros, group_size)
    return out if bias is None else out + bias.to(out.dtype)


@w4a16_gemm.register_fake
def _(x, qweight, scales, zeros, perm, bias, group_size):
    return x.new_empty((x.shape[0], qweight.shape[0]))


class W4A16Linear(RowFusedLinear):
    """y = x W^T + b, W 4-bit per group of `group_size` inputs: qweight int32 [N, K/8], scales
    [N, K/group], zeros uint8 [N, K/group], perm int64 [K] or None."""

    row_tensors = ("qweight", "scales", "zeros")
    shared_tensors = ("perm",)

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                 perm: torch.Tensor | None, bias: torch.Tensor | None, group_size: int) -> None:
        super().__init__(qweight.shape[1] * 8, qweight.shape[0], bias)
        self.group_size = group_size
        self.register_buffer("qweight", qweight.contiguous())
        self.register_buffer("scales", scales.contiguous())
        self.register_buffer("zeros", zeros.to(torch.uint8).contiguous())
        self.register_buffer("perm", perm)

    def options(self) -> tuple:
        """The group size."""
        return (self.group_size,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] -> [..., N] in x's dtype."""
        rows = x.reshape(-1, self.in_features)
        out = w4a16_gemm(rows, self.tensor("qweight"), self.tensor("scales"),
                         self.tensor("zeros"), self.tensor("perm"), self.bias_rows(),
                         self.group_size)
        return out.reshape(*x.shape[:-1], self.out_features)
