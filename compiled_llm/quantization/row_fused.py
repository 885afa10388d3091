"""Quantized linears whose tensors may be row views of a parent's fused tensors.

A RowFusedLinear keeps its tensors as buffers; `row_view` makes one that reads rows [offset,
offset + out_features) of the parent's fused tensors (worker/fuse_weights.py). `row_tensors`
have the output dim first; `shared_tensors` (an input permutation, say) must be equal to fuse.
"""

from __future__ import annotations

import torch
from torch import nn


class RowFusedLinear(nn.Module):
    """Base of the quantized linears: forward reads tensors through `tensor(name)`."""

    row_tensors: tuple[str, ...] = ()
    shared_tensors: tuple[str, ...] = ()

    def __init__(self, in_features: int, out_features: int, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features, self.offset = in_features, out_features, 0
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    def tensor(self, name: str) -> torch.Tensor | None:
        """This linear's rows of `name` (a view of the fused tensor once fused)."""
        if f"fused_{name}" not in self.__dict__:
            return getattr(self, name)
        fused = self.__dict__[f"fused_{name}"]
        if fused is None or name in self.shared_tensors:
            return fused
        return fused.narrow(0, self.offset, self.out_features)

    def fuse_key(self) -> tuple:
        """What siblings must share to fuse: class, input size, options, shared tensors."""
        shared = tuple(getattr(self, name) for name in self.shared_tensors)
        return (type(self), self.in_features, self.options(), self.bias is None,
                *(None if t is None else (t.shape, t.dtype, t.tolist()) for t in shared),
                *(getattr(self, name).dtype for name in self.row_tensors))

    def options(self) -> tuple:
        """Constructor options besides the tensors (group size ...), equal across siblings."""
        return ()

    def row_view(self, fused: dict[str, torch.Tensor | None], bias: torch.Tensor | None,
                 offset: int) -> RowFusedLinear:
        """A copy of self reading rows from `fused` (the parent's tensors, unregistered here so
        that state_dict lists each once and Dynamo lifts each as one graph input)."""
        view = object.__new__(type(self))
        nn.Module.__init__(view)
        view.in_features, view.out_features, view.offset = (self.in_features, self.out_features,
                                                            offset)
        for key, value in self.__dict__.items():
            if not key.startswith("_") and key not in view.__dict__:
                view.__dict__[key] = value  # plain options (group_size ...)
        for name, tensor in fused.items():
            object.__setattr__(view, f"fused_{name}", tensor)
        object.__setattr__(view, "fused_bias", bias)
        return view

    def bias_rows(self) -> torch.Tensor | None:
        """This linear's bias entries (a view of the fused bias once fused)."""
        if "fused_bias" not in self.__dict__:
            return self.bias
        fused = self.__dict__["fused_bias"]
        return None if fused is None else fused.narrow(0, self.offset, self.out_features)

    def extra_repr(self) -> str:
        """in/out features and the rows read."""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"rows={self.offset}:{self.offset + self.out_features}")
