"""compressed-tensors checkpoints (llm-compressor's): one config group on Linear, W4A16
`pack-quantized` (int4 per group or channel, values and asymmetric zero points offset by 8,
activation order `group`'s weight_g_idx) or W8A8 (FP8 per channel, tensor or 128x128 block;
INT8; activations dynamic or static, INT8's static ones symmetric or with a zero point). Layouts:
tensor_specs. A kv_cache_scheme's k/v scales serve kv_cache_dtype="fp8" (worker/kv_cache.py)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from compiled_llm.quantization.packing import act_order_perm, check_groups, unpack_int4
from compiled_llm.quantization.registry import (
    QuantFormat,
    TensorSpecs,
    refuse_unknown,
    register_format,
    require,
)
from compiled_llm.quantization.w4a16 import w4a16_linear
from compiled_llm.quantization.w8a8 import (
    BlockFp8Linear,
    DynamicFp8Linear,
    Int8Linear,
    StaticFp8Linear,
    StaticInt8Linear,
)

W8A8_FORMATS = ("float-quantized", "int-quantized", "naive-quantized")
# the fields compressed-tensors' QuantizationConfig, QuantizationScheme and QuantizationArgs
# write; observers and storage dtypes only steered calibration or how a tensor is saved
TOP_FIELDS = frozenset({
    "quant_method", "config_groups", "format", "global_compression_ratio", "ignore",
    "kv_cache_scheme", "quantization_status", "sparsity_config", "transform_config", "version",
    "moe_sparsity_config"})
GROUP_FIELDS = frozenset({"targets", "weights", "input_activations", "output_activations",
                          "format"})
ARGS_FIELDS = frozenset({
    "num_bits", "type", "symmetric", "group_size", "strategy", "block_structure", "dynamic",
    "actorder", "scale_dtype", "zp_dtype", "observer", "observer_kwargs"})
GROUP_ACTORDER = ("group", "dynamic")  # a weight_g_idx is stored ("weight"/"static": none)
BLOCK = (128, 128)


@register_format
class CompressedTensorsFormat(QuantFormat):
    """The one scheme of a compressed-tensors checkpoint: w4a16, fp8 (dynamic or static
    activations, or 128x128 weight blocks) or int8 (dynamic or static activations: int8,
    int8_static, int8_static_asym)."""

    name = "compressed-tensors"

    def __init__(self, scheme: str, group_size: int | None = None,
                 weight_strategy: str = "channel", symmetric: bool = True,
                 g_idx: bool = False) -> None:
        self.scheme, self.group_size, self.weight_strategy = scheme, group_size, weight_strategy
        self.symmetric, self.g_idx = symmetric, g_idx
        self.marker = "weight_packed" if scheme == "w4a16" else "weight_scale"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> CompressedTensorsFormat:
        """Exactly one config group on Linear; no sparsity, transforms or output
        activations; a kv_cache_scheme only of static per-tensor (or per-head) FP8."""
        fmt = cls("?")
        refuse_unknown(fmt, config, TOP_FIELDS)
        groups = config.get("config_groups") or {}
        if len(groups) != 1:
            fmt.refuse("config_groups", sorted(groups), "exactly one group")
        for field in ("sparsity_config", "transform_config", "moe_sparsity_config"):
            require(fmt, {field: config.get(field) or None}, field, (None,))
        _check_kv_cache_scheme(fmt, config.get("kv_cache_scheme"))
        ((group_name, group),) = groups.items()
        refuse_unknown(fmt, group, GROUP_FIELDS, f"config_groups.{group_name}.")
        require(fmt, {"targets": group.get("targets")}, "targets", (["Linear"],))
        require(fmt, group, "output_activations", (None,))
        weights, acts = group.get("weights") or {}, group.get("input_activations")
        refuse_unknown(fmt, weights, ARGS_FIELDS, "weights.")
        refuse_unknown(fmt, acts or {}, ARGS_FIELDS, "input_activations.")
        fmt_name = group.get("format") or config.get("format")
        if weights.get("num_bits") == 4:
            return cls._w4a16(fmt, weights, acts, fmt_name)
        return cls._w8a8(fmt, weights, acts, fmt_name)

    @classmethod
    def _w4a16(cls, fmt, weights, acts, fmt_name) -> CompressedTensorsFormat:
        require(fmt, {"format": fmt_name}, "format", ("pack-quantized",))
        require(fmt, {"input_activations": acts}, "input_activations", (None,))
        strategy = weights.get("strategy")
        groups = (32, 64, 128) if strategy == "group" else (None, -1)
        actorder = (None, "weight", "static", *(GROUP_ACTORDER if strategy == "group" else ()))
        checks = {"type": ("int",), "strategy": ("group", "channel"), "group_size": groups,
                  "symmetric": (True, False), "actorder": actorder, "dynamic": (False,)}
        for field, allowed in checks.items():
            require(fmt, {f"weights.{field}": weights.get(field)}, f"weights.{field}", allowed)
        return cls("w4a16", group_size=weights["group_size"] if strategy == "group" else -1,
                   symmetric=weights["symmetric"],
                   g_idx=weights.get("actorder") in GROUP_ACTORDER)

    @classmethod
    def _w8a8(cls, fmt, weights, acts, fmt_name) -> CompressedTensorsFormat:
        require(fmt, {"format": fmt_name}, "format", W8A8_FORMATS)
        kind = require(fmt, {"weights.type": weights.get("type")}, "weights.type",
                       ("float", "int"))
        strategies = ("channel", "tensor", "block") if kind == "float" else ("channel", "tensor")
        for field, allowed in (("num_bits", (8,)), ("symmetric", (True,)), ("dynamic", (False,)),
                               ("strategy", strategies)):
            require(fmt, {f"weights.{field}": weights.get(field)}, f"weights.{field}", allowed)
        block = weights["strategy"] == "block"
        if block:
            structure = weights.get("block_structure")
            require(fmt, {"weights.block_structure": structure and tuple(structure)},
                    "weights.block_structure", (BLOCK,))
        scheme = _w8a8_activations(fmt, kind, block, acts or {})
        return cls(scheme, weight_strategy=weights["strategy"])

    def tensor_specs(self, in_features: int, out_features: int) -> TensorSpecs:
        """The scheme's stored tensors."""
        if self.scheme == "w4a16":
            return self._w4a16_specs(in_features, out_features)
        dtype = torch.int8 if self.scheme.startswith("int8") else torch.float8_e4m3fn
        scale_shape = {"channel": (out_features, 1), "tensor": (1,)}.get(self.weight_strategy)
        if scale_shape is None:  # 128x128 blocks; activations in whole groups of 128
            check_groups(self.name, in_features, BLOCK[1])
            scale_shape = (-(-out_features // BLOCK[0]), in_features // BLOCK[1])
        specs = {"weight": ((out_features, in_features), dtype),
                 "weight_scale": (scale_shape, torch.float32)}
        if self.scheme in ("fp8_static", "int8_static", "int8_static_asym"):
            specs["input_scale"] = ((1,), torch.float32)
        if self.scheme == "int8_static_asym":
            specs["input_zero_point"] = ((1,), torch.int8)
        return specs

    def _w4a16_specs(self, in_features: int, out_features: int) -> TensorSpecs:
        group = in_features if self.group_size == -1 else self.group_size
        check_groups(self.name, in_features, group)
        groups = in_features // group
        specs = {"weight_packed": ((out_features, in_features // 8), torch.int32),
                 "weight_scale": ((out_features, groups), torch.float32),
                 "weight_shape": ((2,), torch.int64)}
        if not self.symmetric:
            specs["weight_zero_point"] = ((-(-out_features // 8), groups), torch.int32)
        if self.g_idx:
            specs["weight_g_idx"] = ((in_features,), torch.int32)
        return specs

    def convert(self, tensors, bias, dtype) -> nn.Module:
        """A W4A16Linear, Int8Linear, StaticInt8Linear, DynamicFp8Linear, StaticFp8Linear or
        BlockFp8Linear."""
        if self.scheme == "w4a16":
            return self._w4a16_linear(tensors, bias, dtype)
        weight = tensors["weight"]
        if self.weight_strategy == "block":  # block scales expanded to one row per output
            scale = tensors["weight_scale"].repeat_interleave(BLOCK[0], dim=0)
            return BlockFp8Linear(weight, scale[: weight.shape[0]].contiguous(), bias)
        scale = tensors["weight_scale"].reshape(-1, 1).expand(weight.shape[0], 1)
        if self.scheme == "int8":
            return Int8Linear(weight, scale, bias)
        if self.scheme == "fp8":
            return DynamicFp8Linear(weight, scale, bias)
        if self.scheme.startswith("int8_static"):
            return StaticInt8Linear(weight, scale, tensors["input_scale"],
                                    tensors.get("input_zero_point"), bias)
        return StaticFp8Linear(weight, scale, tensors["input_scale"], bias)

    def _w4a16_linear(self, tensors, bias, dtype) -> nn.Module:
        """Values and zero points (both stored offset by 8, so W = (q - z) * s holds for the
        unsigned nibbles); activation order `group` becomes an input permutation."""
        packed, scale = tensors["weight_packed"], tensors["weight_scale"]
        shape = tuple(tensors["weight_shape"].tolist())
        if shape != (packed.shape[0], packed.shape[1] * 8):
            raise ValueError(f"compressed-tensors checkpoint: weight_shape {shape} does not "
                             f"match weight_packed {tuple(packed.shape)}")
        values, rows = unpack_int4(packed), packed.shape[0]
        group = values.shape[1] // scale.shape[1]
        if self.symmetric:
            zeros = torch.full(scale.shape, 8, dtype=torch.uint8, device=scale.device)
        else:  # packed along N: unpack the transpose
            zeros = unpack_int4(tensors["weight_zero_point"].t().contiguous()).t()[:rows]
        perm = act_order_perm(tensors["weight_g_idx"], group) if self.g_idx else None
        if perm is not None:
            values = values[:, perm]
        return w4a16_linear(values, scale, zeros, perm, bias, group, dtype)


def _w8a8_activations(fmt: QuantFormat, kind: str, block: bool, acts: dict[str, Any]) -> str:
    """The scheme for W8A8 weights of `kind` and these input activations, or fmt.refuse:
    FP8 per token (dynamic) or per tensor (static), per group of 128 with block weights;
    INT8 per token (dynamic, symmetric) or per tensor (static, symmetric or not)."""
    key = (acts.get("type"), acts.get("strategy"), acts.get("dynamic"), acts.get("num_bits"),
           acts.get("symmetric"))
    if block:
        if key != ("float", "group", True, 8, True) or acts.get("group_size") != BLOCK[1]:
            fmt.refuse("input_activations", acts or None,
                       "8-bit float symmetric, dynamic per group of 128 with block weights")
        return "fp8_block"
    schemes = ({("float", "token", True, 8, True): "fp8",
                ("float", "tensor", False, 8, True): "fp8_static"} if kind == "float"
               else {("int", "token", True, 8, True): "int8",
                     ("int", "tensor", False, 8, True): "int8_static",
                     ("int", "tensor", False, 8, False): "int8_static_asym"})
    if key not in schemes:
        fmt.refuse("input_activations", acts or None, "8-bit symmetric, dynamic per token, or "
                   "static per tensor" + (" (symmetric or not)" if kind == "int" else ""))
    return schemes[key]


def _check_kv_cache_scheme(fmt: QuantFormat, scheme: dict[str, Any] | None) -> None:
    """None, or static symmetric FP8 per tensor / per KV head (what the KV cache reads)."""
    if not scheme:
        return
    refuse_unknown(fmt, scheme, ARGS_FIELDS, "kv_cache_scheme.")
    key = (scheme.get("num_bits"), scheme.get("type"), scheme.get("symmetric"),
           bool(scheme.get("dynamic")), scheme.get("strategy"))
    if key not in ((8, "float", True, False, "tensor"), (8, "float", True, False, "attn_head")):
        fmt.refuse("kv_cache_scheme", scheme, "8-bit float symmetric static per tensor or "
                   "per attention head")
