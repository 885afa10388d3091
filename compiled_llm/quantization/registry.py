"""Checkpoint quantization formats: QUANT_FORMATS maps quantization_config's `quant_method` to a
format class whose `from_config` validates it: ValueError naming the format and the field for
anything not implemented, and for any field it does not know (one that changes the weights'
meaning must never be ignored). A format names each quantized linear's stored tensors
(`tensor_specs`) and turns them into the module that runs them (`convert`)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

TensorSpecs = dict[str, tuple[tuple[int, ...], torch.dtype]]


class QuantFormat:
    """One checkpoint format, configured from its quantization_config."""

    name: ClassVar[str]
    marker: ClassVar[str] = "weight_scale"  # a linear whose `<prefix>.<marker>` is stored
    # the quantization_config field that rules out MoE models' routed experts (None: this
    # format holds them, moe_fp8.py)
    moe_field: ClassVar[str | None] = "quant_method"
    # a format dequantized as its tensors are read (tensor_stream), no module swapped (mxfp4.py)
    dequantizes_at_load: ClassVar[bool] = False

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> QuantFormat:
        """Validate `config` (ValueError naming the field); the configured format."""
        raise NotImplementedError

    def tensor_specs(self, in_features: int, out_features: int) -> TensorSpecs:
        """Checkpoint tensor name (after the linear's prefix) -> (shape, dtype) as stored."""
        raise NotImplementedError

    def convert(self, tensors: dict[str, torch.Tensor], bias: torch.Tensor | None,
                dtype: torch.dtype) -> nn.Module:
        """The runnable linear for one linear's loaded tensors; activations in `dtype`."""
        raise NotImplementedError

    def refuse(self, field: str, value: Any, supported: str) -> None:
        """Raise the ValueError that names this format and the unsupported field."""
        raise ValueError(f"{self.name} checkpoint: quantization_config.{field}={value!r} is "
                         f"not supported (supported: {supported})")


QUANT_FORMATS: dict[str, type[QuantFormat]] = {}


def register_format(cls: type[QuantFormat]) -> type[QuantFormat]:
    """Class decorator: QUANT_FORMATS[cls.name] = cls."""
    QUANT_FORMATS[cls.name] = cls
    return cls


def require(fmt: QuantFormat, config: dict[str, Any], field: str, allowed: tuple,
            default: Any = None) -> Any:
    """config[field] (or default) when it is one of `allowed`, else fmt.refuse(...)."""
    value = config.get(field, default)
    if value not in allowed:
        fmt.refuse(field, value, ", ".join(map(repr, allowed)))
    return value


def refuse_unknown(fmt: QuantFormat, config: dict[str, Any], known: frozenset[str],
                   prefix: str = "") -> None:
    """ValueError naming the format and the first field of `config` not in `known` (the
    fields this loader reads, and those the publishing libraries write that do not change
    the stored weights' meaning, such as calibration settings). A field left unset (None,
    False or empty) asks for nothing and passes: a newer library's defaults are not refused."""
    for field in sorted(config):
        if field not in known and config[field] not in (None, False, "", [], {}):
            raise ValueError(f"{fmt.name} checkpoint: quantization_config.{prefix}{field}="
                             f"{config[field]!r} is not understood by this loader (known "
                             f"fields: {', '.join(sorted(known))})")
