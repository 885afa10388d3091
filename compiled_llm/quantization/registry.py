"""Checkpoint quantization formats, detected from config.json's `quantization_config`.

QUANT_FORMATS maps `quant_method` to a format class whose `from_config` validates the config
(ValueError naming the format and the field for anything not implemented). A format names the
checkpoint tensors of each quantized linear (`tensor_specs`) and turns them, once loaded, into
the module that runs them (`convert`); quantization/loading.py applies it to a model.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

TensorSpecs = dict[str, tuple[tuple[int, ...], torch.dtype]]


class QuantFormat:
    """One checkpoint format, configured from its quantization_config."""

    name: ClassVar[str]
    marker: ClassVar[str] = "weight_scale"  # a linear whose `<prefix>.<marker>` is stored

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


def detect_format(hf_config: dict[str, Any], quantization: str | None) -> QuantFormat | None:
    """The checkpoint's format (None when it is not quantized); ValueError for an unknown
    quant_method or an explicit `quantization` that the checkpoint contradicts."""
    from compiled_llm.quantization import formats  # noqa: F401 (registers the formats)

    config = hf_config.get("quantization_config")
    if config is None:
        if quantization not in (None, "fp8"):  # fp8 alone also quantizes at load
            raise ValueError(f"quantization={quantization!r} needs a checkpoint quantized that "
                             "way, but config.json has no quantization_config")
        return None
    method = config.get("quant_method")
    if method not in QUANT_FORMATS:
        raise ValueError(f"quantization_config.quant_method={method!r} is not supported "
                         f"(supported: {', '.join(sorted(QUANT_FORMATS))})")
    if quantization is not None and quantization != method:
        raise ValueError(f"quantization={quantization!r} conflicts with the checkpoint's "
                         f"quantization_config.quant_method={method!r}; leave it unset")
    return QUANT_FORMATS[method].from_config(config)


def require(fmt: QuantFormat, config: dict[str, Any], field: str, allowed: tuple,
            default: Any = None) -> Any:
    """config[field] (or default) when it is one of `allowed`, else fmt.refuse(...)."""
    value = config.get(field, default)
    if value not in allowed:
        fmt.refuse(field, value, ", ".join(map(repr, allowed)))
    return value
