"""Detecting a checkpoint's quantization format and applying it to a model, from outside it.

Before the weights load, every nn.Linear whose `<prefix>.<marker>` tensor the checkpoint holds
becomes a CheckpointLinear with parameters named and shaped as stored (one value: [1] or 0-d), so
the loader fills and checks them as any other; afterwards each becomes the format's module."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from compiled_llm.quantization import formats, mxfp4  # noqa: F401 (registers the formats)
from compiled_llm.quantization.registry import QUANT_FORMATS, QuantFormat


class CheckpointLinear(nn.Module):
    """A linear's tensors as the checkpoint stores them, filled by the loader, then converted."""

    def __init__(self, linear: nn.Linear, fmt: QuantFormat,
                 stored: dict[str, tuple[int, ...]] | None = None, prefix: str = "") -> None:
        """`stored`: the checkpoint's tensor shapes; this linear's tensors are `prefix + name`."""
        super().__init__()
        self.in_features, self.out_features, self.fmt = (linear.in_features,
                                                         linear.out_features, fmt)
        device = linear.weight.device
        for name, (shape, dtype) in fmt.tensor_specs(self.in_features, self.out_features).items():
            shape = _one_value_shape(fmt, name, shape, (stored or {}).get(prefix + name))
            empty = torch.empty(shape, dtype=dtype, device=device)
            self.register_parameter(name, nn.Parameter(empty, requires_grad=False))
        self.bias = linear.bias
        self.dtype = linear.weight.dtype

    def convert(self) -> nn.Module:
        """The format's runnable module over the loaded tensors."""
        tensors = {name: param.data for name, param in self._parameters.items()
                   if name != "bias"}
        bias = None if self.bias is None else self.bias.data
        return self.fmt.convert(tensors, bias, self.dtype)


def _one_value_shape(fmt: QuantFormat, name: str, shape: tuple[int, ...],
                     stored: tuple[int, ...] | None) -> tuple[int, ...]:
    """A per-tensor value (`shape` (1,)) as stored: [1] or a scalar (AutoFP8 writes 0-d
    tensors); ValueError naming the format for more than one value (per-channel scales)."""
    if shape != (1,) or stored is None:
        return shape
    if stored not in ((), (1,)):
        raise ValueError(f"{fmt.name} checkpoint: {name} has shape {stored}; this format "
                         "stores one value per tensor (shape [1] or a scalar)")
    return stored


# vLLM picks a kernel by these names; the format's own kernels run here
KERNEL_ALIASES = {"gptq_marlin": "gptq", "awq_marlin": "awq"}


def detect_format(hf_config: dict[str, Any], quantization: str | None) -> QuantFormat | None:
    """The checkpoint's format (None when it is not quantized); ValueError for an unknown
    quant_method or an explicit `quantization` that the checkpoint contradicts. vLLM's
    names of a format's Marlin kernels (gptq_marlin, awq_marlin) name the format here."""
    quantization = KERNEL_ALIASES.get(quantization, quantization)
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


def checkpoint_shapes(files: Iterable[Path]) -> dict[str, tuple[int, ...]]:
    """Every tensor name in the safetensors files -> its shape (headers only)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for path in files:
        if path.suffix != ".safetensors":
            raise ValueError(f"{path.name}: quantized checkpoints load from safetensors only")
        with open(path, "rb") as reader:  # 8 bytes of header length, then the JSON header
            header = json.loads(reader.read(int.from_bytes(reader.read(8), "little")))
        shapes.update({name: tuple(entry["shape"]) for name, entry in header.items()
                       if name != "__metadata__"})
    return shapes


def _swap(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, module)


def _prepare_experts(model: nn.Module, fmt: QuantFormat, stored: Collection[str]) -> list[str]:
    """Block-FP8 routed experts where the checkpoint stores them so; ValueError for the MoE
    models of the other formats (and of per-tensor FP8)."""
    if getattr(getattr(model, "config", None), "moe", None) is None:
        return []
    if fmt.moe_field is not None:
        raise ValueError(f"{fmt.name} checkpoints of mixture-of-experts models are not "
                         f"supported yet (quantization_config.{fmt.moe_field}; fp8 with "
                         "weight_block_size [128, 128] is)")
    from compiled_llm.quantization.moe_fp8 import prepare_fp8_experts

    return prepare_fp8_experts(model, set(stored))


def _refuse_quantized_head(fmt: QuantFormat, stored: Collection[str],
                           targets: list[str]) -> None:
    """ValueError for a quantized LM head (compressed-tensors without lm_head in `ignore`):
    the head here is the model's own module, not a plain linear the format could replace, and
    the loader would otherwise fail on a tensor name only."""
    if f"lm_head.{fmt.marker}" in stored and "lm_head" not in targets:
        raise ValueError(f"{fmt.name} checkpoint: a quantized lm_head is not supported (the "
                         f"checkpoint stores lm_head.{fmt.marker}; publish it with lm_head "
                         "left unquantized, e.g. in quantization_config.ignore)")


def prepare_quantized(model: nn.Module, fmt: QuantFormat,
                      files: list[Path]) -> Callable[[], nn.Module]:
    """Swap the checkpoint's quantized linears for CheckpointLinears; returns the step that
    converts them once the weights are in (it returns the model). Block-FP8 routed experts
become Fp8FusedMoE (their parameters as stored, stacked: nothing to convert)."""
    stored = checkpoint_shapes(files)
    experts = _prepare_experts(model, fmt, stored)
    targets = [name for name, module in model.named_modules()
               if type(module) is nn.Linear and f"{name}.{fmt.marker}" in stored]
    if not targets and not experts:
        raise ValueError(f"{fmt.name} checkpoint: no linear has a {fmt.marker!r} tensor")
    _refuse_quantized_head(fmt, stored, targets)
    for name in targets:
        try:
            checkpoint_linear = CheckpointLinear(model.get_submodule(name), fmt, stored,
                                                 f"{name}.")
        except ValueError as error:  # say which linear the format cannot hold
            raise ValueError(f"{name}: {error}") from None
        _swap(model, name, checkpoint_linear)

    def finalize() -> nn.Module:
        for name in targets:
            _swap(model, name, model.get_submodule(name).convert())
        return model

    return finalize
