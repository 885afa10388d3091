"""Load-time fused weight layout: sibling linears that read one input (q/k/v under self_attn,
gate/up under mlp or shared_expert) share one contiguous weight [sum(N_i), K] on their parent;
each becomes a RowSliceLinear reading its rows (FP8: RowSliceFp8Linear; a checkpoint's
RowFusedLinear: a row view of its fused packed weight, scales, zeros). The graph then shows
slices of one base, which `HorizontalGemmFusionPass` turns into one matmul; numerics unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from compiled_llm.models.layers import SIBLINGS
from compiled_llm.quantization.fp8 import Fp8Linear
from compiled_llm.quantization.row_fused import RowFusedLinear


class RowSliceLinear(nn.Module):
    """y = x W[rows]^T + b[rows], reading rows [offset, offset + out_features) of a fused weight
    (and bias) that the parent module owns; no copy is made, per step or ever."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None, offset: int,
                 out_features: int) -> None:
        super().__init__()
        self.in_features, self.out_features, self.offset = weight.shape[1], out_features, offset
        # Plain attributes, not registered: the parent owns the parameters, so state_dict and
        # named_parameters list each fused tensor once, and Dynamo lifts it as one graph input.
        object.__setattr__(self, "fused_weight", weight)
        object.__setattr__(self, "fused_bias", bias)

    @property
    def weight(self) -> torch.Tensor:
        """This linear's rows of the fused weight (a view)."""
        return self.fused_weight.narrow(0, self.offset, self.out_features)

    @property
    def bias(self) -> torch.Tensor | None:
        """This linear's entries of the fused bias (a view), or None."""
        if self.fused_bias is None:
            return None
        return self.fused_bias.narrow(0, self.offset, self.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] -> [..., N]."""
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        """in/out features and the rows read."""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"rows={self.offset}:{self.offset + self.out_features}")


class RowSliceFp8Linear(Fp8Linear):
    """An Fp8Linear reading rows [offset, offset + out_features) of a fused FP8 weight, its
    per-row scales (and bias) that the parent owns; no copy is made."""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, bias: nn.Parameter | None,
                 offset: int, out_features: int) -> None:
        nn.Module.__init__(self)  # Fp8Linear's own init quantizes a weight: nothing to do here
        self.in_features, self.out_features, self.offset = weight.shape[1], out_features, offset
        for name, tensor in (("fused_weight", weight), ("fused_scale", scale),
                             ("fused_bias", bias)):
            object.__setattr__(self, name, tensor)  # unregistered, as in RowSliceLinear

    weight = RowSliceLinear.weight
    bias = RowSliceLinear.bias

    @property
    def weight_scale(self) -> torch.Tensor:
        """This linear's rows of the fused per-row scales [N, 1] (a view)."""
        return self.fused_scale.narrow(0, self.offset, self.out_features)


def _fusable(linears: list[nn.Module]) -> bool:
    # Only linears of one kind (plain or FP8), one input size and dtype, all with or without bias.
    if isinstance(linears[0], RowFusedLinear):
        return all(isinstance(lin, RowFusedLinear) and lin.fuse_key() == linears[0].fuse_key()
                   for lin in linears)
    kind = type(linears[0])
    if kind not in (nn.Linear, Fp8Linear) or not all(type(lin) is kind for lin in linears):
        return False
    first = linears[0]
    return all(lin.in_features == first.in_features and lin.weight.dtype == first.weight.dtype
               and (lin.bias is None) == (first.bias is None) for lin in linears)


def _concat(tensors: list[torch.Tensor]) -> nn.Parameter:
    return nn.Parameter(torch.cat([t.detach() for t in tensors]), requires_grad=False)


def _slice_modules(parent: nn.Module, fused_name: str, linears: list[nn.Module],
                   bias: nn.Parameter | None) -> Callable[[int, int], nn.Module]:
    """Register the fused weight (FP8: and scales) on parent; a factory per child's rows."""
    if isinstance(linears[0], RowFusedLinear):
        return _quantized_slices(parent, fused_name, linears, bias)
    if type(linears[0]) is nn.Linear:
        weight = _concat([lin.weight for lin in linears])
        parent.register_parameter(f"{fused_name}_weight", weight)
        return lambda offset, rows: RowSliceLinear(weight, bias, offset, rows)
    # FP8 weights and scales are buffers, as Fp8Linear keeps them
    weight = torch.cat([lin.weight for lin in linears])
    scale = torch.cat([lin.weight_scale for lin in linears])
    parent.register_buffer(f"{fused_name}_weight", weight)
    parent.register_buffer(f"{fused_name}_weight_scale", scale)
    return lambda offset, rows: RowSliceFp8Linear(weight, scale, bias, offset, rows)


def _quantized_slices(parent: nn.Module, fused_name: str, linears: list[RowFusedLinear],
                      bias: nn.Parameter | None) -> Callable[[int, int], nn.Module]:
    """Concatenate each row tensor along the output dim (shared ones are equal: the first's)."""
    first, fused = linears[0], {}
    for name in first.row_tensors:
        fused[name] = torch.cat([getattr(lin, name) for lin in linears])
    for name in first.shared_tensors:
        fused[name] = getattr(first, name)
    for name, tensor in fused.items():
        parent.register_buffer(f"{fused_name}_{name}", tensor)
    by_offset, offset = {}, 0
    for lin in linears:
        by_offset[offset] = lin
        offset += lin.out_features
    return lambda offset, rows: by_offset[offset].row_view(fused, bias, offset)


def fuse_group(parent: nn.Module, fused_name: str, children: tuple[str, ...]) -> bool:
    """Give parent one `<fused_name>_weight` (and `_bias`) holding children's rows in order, and
    swap each child for a RowSliceLinear over it. False (nothing changed) if they do not fit."""
    linears = [getattr(parent, name, None) for name in children]
    if any(lin is None for lin in linears) or not _fusable(linears):
        return False
    bias = None if linears[0].bias is None else _concat([lin.bias for lin in linears])
    make_slice = _slice_modules(parent, fused_name, linears, bias)
    parent.register_parameter(f"{fused_name}_bias", bias)
    offset = 0
    for name, lin in zip(children, linears):
        setattr(parent, name, make_slice(offset, lin.out_features))
        offset += lin.out_features
    return True


def fuse_sibling_weights(model: nn.Module) -> int:
    """Apply fuse_group to every module named like a SIBLINGS parent; returns groups fused."""
    fused = 0
    for name, module in list(model.named_modules()):
        rule = SIBLINGS.get(name.rpartition(".")[2])
        if rule is not None:
            fused += fuse_group(module, *rule)
    return fused
