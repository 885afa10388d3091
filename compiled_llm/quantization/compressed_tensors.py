"""compressed-tensors checkpoints (llm-compressor's format): one config group targeting Linear,
as W4A16 `pack-quantized` (symmetric int4, group 32/64/128: weight_packed int32 [N, K/8] with
values offset by 8, weight_scale [N, K/group], weight_shape), or W8A8 `float-quantized` /
`int-quantized` (weight [N, K], weight_scale [N, 1] per channel or [1] per tensor, input_scale
[1] for static activations).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from compiled_llm.quantization.registry import QuantFormat, TensorSpecs, register_format, require
from compiled_llm.quantization.w4a16 import W4A16Linear
from compiled_llm.quantization.w8a8 import DynamicFp8Linear, Int8Linear, StaticFp8Linear

W8A8_FORMATS = ("float-quantized", "int-quantized", "naive-quantized")


@register_format
class CompressedTensorsFormat(QuantFormat):
    """The one scheme of a compressed-tensors checkpoint: w4a16, fp8 (dynamic or static
    activations) or int8 (dynamic activations)."""

    name = "compressed-tensors"

    def __init__(self, scheme: str, group_size: int | None = None,
                 weight_strategy: str = "channel") -> None:
        self.scheme, self.group_size, self.weight_strategy = scheme, group_size, weight_strategy
        self.marker = "weight_packed" if scheme == "w4a16" else "weight_scale"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> CompressedTensorsFormat:
        """Exactly one config group on Linear, no kv_cache_scheme, sparsity or transforms."""
        fmt = cls("?")
        groups = config.get("config_groups") or {}
        if len(groups) != 1:
            fmt.refuse("config_groups", sorted(groups), "exactly one group")
        for field in ("kv_cache_scheme", "sparsity_config", "transform_config"):
            require(fmt, {field: config.get(field) or None}, field, (None,))
        (group,) = groups.values()
        require(fmt, {"targets": group.get("targets")}, "targets", (["Linear"],))
        weights, acts = group.get("weights") or {}, group.get("input_activations")
        fmt_name = group.get("format") or config.get("format")
        if weights.get("num_bits") == 4:
            return cls._w4a16(fmt, weights, acts, fmt_name)
        return cls._w8a8(fmt, weights, acts, fmt_name)

    @classmethod
    def _w4a16(cls, fmt, weights, acts, fmt_name) -> CompressedTensorsFormat:
        require(fmt, {"format": fmt_name}, "format", ("pack-quantized",))
        require(fmt, {"input_activations": acts}, "input_activations", (None,))
        checks = {"type": ("int",), "strategy": ("group",), "group_size": (32, 64, 128),
                  "symmetric": (True,), "actorder": (None,), "dynamic": (False,)}
        for field, allowed in checks.items():
            require(fmt, {f"weights.{field}": weights.get(field)}, f"weights.{field}", allowed)
        return cls("w4a16", group_size=weights["group_size"])

    @classmethod
    def _w8a8(cls, fmt, weights, acts, fmt_name) -> CompressedTensorsFormat:
        require(fmt, {"format": fmt_name}, "format", W8A8_FORMATS)
        kind = require(fmt, {"weights.type": weights.get("type")}, "weights.type",
                       ("float", "int"))
        for field, allowed in (("num_bits", (8,)), ("symmetric", (True,)), ("dynamic", (False,)),
                               ("strategy", ("channel", "tensor") if kind == "float"
                                else ("channel",))):
            require(fmt, {f"weights.{field}": weights.get(field)}, f"weights.{field}", allowed)
        acts = acts or {}
        pair = (acts.get("type"), acts.get("strategy"), acts.get("dynamic"),
                acts.get("num_bits"), acts.get("symmetric"))
        allowed = ({("float", "token", True, 8, True), ("float", "tensor", False, 8, True)}
                   if kind == "float" else {("int", "token", True, 8, True)})
        if pair not in allowed:
            fmt.refuse("input_activations", acts or None,
                       "8-bit symmetric, dynamic per token" + (
                           " or static per tensor" if kind == "float" else ""))
        scheme = "int8" if kind == "int" else ("fp8_static" if not acts["dynamic"] else "fp8")
        return cls(scheme, weight_strategy=weights["strategy"])

    def tensor_specs(self, in_features: int, out_features: int) -> TensorSpecs:
        """The scheme's stored tensors."""
        if self.scheme == "w4a16":
            return {"weight_packed": ((out_features, in_features // 8), torch.int32),
                    "weight_scale": ((out_features, in_features // self.group_size),
                                     torch.float32),
                    "weight_shape": ((2,), torch.int64)}
        dtype = torch.int8 if self.scheme == "int8" else torch.float8_e4m3fn
        scale_shape = (out_features, 1) if self.weight_strategy == "channel" else (1,)
        specs = {"weight": ((out_features, in_features), dtype),
                 "weight_scale": (scale_shape, torch.float32)}
        if self.scheme == "fp8_static":
            specs["input_scale"] = ((1,), torch.float32)
        return specs

    def convert(self, tensors, bias, dtype) -> nn.Module:
        """W4A16Linear (zero point 8), Int8Linear, DynamicFp8Linear or StaticFp8Linear."""
        if self.scheme == "w4a16":
            packed, scale = tensors["weight_packed"], tensors["weight_scale"]
            shape = tuple(tensors["weight_shape"].tolist())
            if shape != (packed.shape[0], packed.shape[1] * 8):
                raise ValueError(f"compressed-tensors checkpoint: weight_shape {shape} does not "
                                 f"match weight_packed {tuple(packed.shape)}")
            zeros = torch.full(scale.shape, 8, dtype=torch.uint8, device=scale.device)
            return W4A16Linear(packed, scale.to(dtype), zeros, None, bias, self.group_size)
        weight = tensors["weight"]
        scale = tensors["weight_scale"].reshape(-1, 1).expand(weight.shape[0], 1)
        if self.scheme == "int8":
            return Int8Linear(weight, scale, bias)
        if self.scheme == "fp8":
            return DynamicFp8Linear(weight, scale, bias)
        return StaticFp8Linear(weight, scale, tensors["input_scale"], bias)
