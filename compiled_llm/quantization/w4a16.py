"""W4A16 linears: 4-bit weights kept packed on the device (canonical layout of packing.py),
activations in the model dtype. On CUDA `compiled_llm::w4a16_gemm` takes the path w4a16_tuning's
w4a16_path picks per shape and token count: the Triton GEMV (few tokens, where tuned or forced),
tinygemm (tinygemm.py, tensors from prepare_tinygemm), the Triton tiles, dequantize-then-matmul at
prefill sizes; off CUDA a torch reference. Fullgraph."""

from __future__ import annotations

import torch
from torch import nn

from compiled_llm.quantization.packing import dequantize_int4, kernel_groups, pack_int4
from compiled_llm.quantization.row_fused import RowFusedLinear
from compiled_llm.quantization.tinygemm import (
    N_TILE,
    tinygemm_available,
    tinygemm_mm,
    tinygemm_tensors,
)


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
               group_size: int, tinygemm_weight: torch.Tensor | None = None,
               tinygemm_scales_zeros: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, K] @ dequant(qweight [N, K/8], scales, zeros [N, K/group]).T (+ bias) -> [T, N];
    `perm` [K] (GPTQ act-order) reorders x's columns first. The tinygemm tensors (the same
    weight, tinygemm.py; row-sliced like qweight) run bf16 x of up to the tuned row count."""
    if not x.is_cuda:
        return w4a16_reference(x, qweight, scales, zeros, perm, bias, group_size)
    from compiled_llm.quantization.kernels.w4a16_tuning import device_name

    return w4a16_kernels(x, qweight, scales, zeros, perm, bias, group_size, tinygemm_weight,
                         tinygemm_scales_zeros, device_name(x.device.index or 0))


def w4a16_kernels(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                  zeros: torch.Tensor, perm: torch.Tensor | None, bias: torch.Tensor | None,
                  group_size: int, tinygemm_weight: torch.Tensor | None,
                  tinygemm_scales_zeros: torch.Tensor | None, gpu: str) -> torch.Tensor:
    """The op's kernel side on the GPU named `gpu` (under TRITON_INTERPRET=1, CPU tensors: the
    tests'): perm, the path w4a16_path picks with that GPU's tuned files, bias."""
    from compiled_llm.quantization.kernels.w4a16 import (
        w4a16_config,
        w4a16_gemm_triton,
        w4a16_gemv_config,
    )
    from compiled_llm.quantization.kernels.w4a16_dequant import w4a16_dequant_mm
    from compiled_llm.quantization.kernels.w4a16_tuning import lookup, w4a16_path

    if perm is not None:
        x = x.index_select(1, perm)
    (m, k), n = x.shape, qweight.shape[0]
    tinygemm_ok = tinygemm_weight is not None and x.dtype == torch.bfloat16
    path = w4a16_path(gpu, m, n, k, tinygemm_ok)
    if path == "tinygemm":
        out = tinygemm_mm(x, tinygemm_weight, tinygemm_scales_zeros, group_size)
    elif path == "dequant":
        out = w4a16_dequant_mm(x, qweight, scales, zeros, group_size)
    else:
        config = lookup(gpu, m, n, k)
        if path == "gemv" and (config is None or not config.gemv):  # forced, or tuned elsewhere
            config = w4a16_gemv_config(m, n, k, group_size)
        elif path == "mma" and (config is None or config.gemv):  # forced, or a GEMV's entry
            config = w4a16_config(m, n, k, group_size)  # the built-in MMA tiles
        out = w4a16_gemm_triton(x, qweight, scales.to(x.dtype), zeros, group_size, config)
    return out if bias is None else out + bias.to(out.dtype)


@w4a16_gemm.register_fake
def _(x, qweight, scales, zeros, perm, bias, group_size, tinygemm_weight=None,
      tinygemm_scales_zeros=None):
    return x.new_empty((x.shape[0], qweight.shape[0]))


class W4A16Linear(RowFusedLinear):
    """y = x W^T + b, W 4-bit per group of `group_size` inputs: qweight int32 [N, K/8], scales
    [N, K/group], zeros uint8 [N, K/group], perm int64 [K] or None; on CUDA also tinygemm's
    packed weight [N, K/8] and scales_zeros [N, K/group, 2] once prepare_tinygemm ran (the
    4-bit weight is then held twice: tinygemm for few tokens, qweight for the Triton kernel)."""

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
        self.register_buffer("tinygemm_weight", None)
        self.register_buffer("tinygemm_scales_zeros", None)

    def options(self) -> tuple:
        """The group size."""
        return (self.group_size,)

    def qweight_device(self) -> torch.device:
        """The device of the (fused) packed weight."""
        return self.tensor("qweight").device

    def set_fused_tinygemm(self, weight: torch.Tensor, scales_zeros: torch.Tensor) -> None:
        """Read this row view's tinygemm tensors as rows of the parent's fused ones (whose
        buffers the parent registers, as for qweight)."""
        object.__setattr__(self, "fused_tinygemm_weight", weight)
        object.__setattr__(self, "fused_tinygemm_scales_zeros", scales_zeros)

    def _tinygemm_rows(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if "fused_qweight" in self.__dict__ and "fused_tinygemm_weight" not in self.__dict__:
            return None, None  # a row view without tinygemm tensors
        return self.tensor("tinygemm_weight"), self.tensor("tinygemm_scales_zeros")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] -> [..., N] in x's dtype."""
        rows = x.reshape(-1, self.in_features)
        out = w4a16_gemm(rows, self.tensor("qweight"), self.tensor("scales"),
                         self.tensor("zeros"), self.tensor("perm"), self.bias_rows(),
                         self.group_size, *self._tinygemm_rows())
        return out.reshape(*x.shape[:-1], self.out_features)


def w4a16_linear(values: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                 perm: torch.Tensor | None, bias: torch.Tensor | None, group_size: int,
                 dtype: torch.dtype) -> W4A16Linear:
    """The W4A16Linear of unpacked values [N, K] (0..15, in `perm` order), scales and zeros
    [N, K / group_size]; scales in `dtype`; one group per row (per channel) runs as groups of
    128 where K allows (packing.kernel_groups)."""
    scales, zeros, group_size = kernel_groups(scales.to(dtype), zeros, group_size,
                                              values.shape[1])
    return W4A16Linear(pack_int4(values.contiguous()), scales, zeros, perm, bias, group_size)


def prepare_tinygemm(model: nn.Module) -> int:
    """Give every CUDA W4A16Linear that qualifies its tinygemm tensors (buffers; a row view
    reads rows of its parent's, made once from the fused tensors); returns how many linears
    got them. Nothing changes off CUDA or where tinygemm is unavailable."""
    linears = [(parent, child) for parent in model.modules()
               for child in parent.children() if isinstance(child, W4A16Linear)]
    device = linears[0][1].qweight_device() if linears else torch.device("cpu")
    if device.type != "cuda" or not tinygemm_available(device):
        return 0
    return sum(_prepare_child(parent, child) for parent, child in linears)


def _prepare_child(parent: nn.Module, child: W4A16Linear) -> int:
    """Give one linear (or row view) its tinygemm tensors; 1 if it got them."""
    fused = child.__dict__.get("fused_qweight")
    if fused is None:  # a whole linear: its own buffers
        made = tinygemm_tensors(child.qweight, child.scales, child.zeros, child.group_size)
        if made is not None:
            child.tinygemm_weight, child.tinygemm_scales_zeros = made
        return int(made is not None)
    prefix = next((key[: -len("_qweight")] for key, buf in parent.named_buffers(recurse=False)
                   if key.endswith("_qweight") and buf is fused), None)
    if prefix is None:
        return 0
    made_name = f"{prefix}_tinygemm_weight"
    if made_name not in parent._buffers:  # first row view of this fused weight: pack it
        made = tinygemm_tensors(fused, child.__dict__["fused_scales"],
                                child.__dict__["fused_zeros"], child.group_size)
        parent.register_buffer(made_name, None if made is None else made[0])
        parent.register_buffer(f"{prefix}_tinygemm_scales_zeros",
                               None if made is None else made[1])
    weight = parent._buffers[made_name]
    if weight is None or child.offset % N_TILE or child.out_features % N_TILE:
        return 0
    child.set_fused_tinygemm(weight, parent._buffers[f"{prefix}_tinygemm_scales_zeros"])
    return 1
