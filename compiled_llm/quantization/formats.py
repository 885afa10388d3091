"""GPTQ, AWQ and FP8 (128x128 blocks or per tensor) checkpoints: their stored tensors (each
class says the layout) and the conversion to the modules that run them (compressed-tensors lives
in compressed_tensors.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from compiled_llm.quantization import compressed_tensors  # noqa: F401 (registers it)
from compiled_llm.quantization.packing import act_order_perm, check_groups, unpack_int4
from compiled_llm.quantization.registry import (
    QuantFormat,
    TensorSpecs,
    refuse_unknown,
    register_format,
    require,
)
from compiled_llm.quantization.w4a16 import w4a16_linear
from compiled_llm.quantization.w8a8 import BlockFp8Linear, DynamicFp8Linear, StaticFp8Linear

GROUP_SIZES = (32, 64, 128)
AWQ_UNPACK_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # value j of a word sits in nibble AWQ_UNPACK_ORDER[j]
# what GPTQ's publishers (AutoGPTQ, GPTQModel, optimum / transformers' GPTQConfig) write that
# only steered the quantization run or the loading library, not the stored weights' meaning
GPTQ_BENIGN = frozenset({
    "quant_method", "damp_percent", "damp_auto_increment", "static_groups", "true_sequential",
    "model_name_or_path", "model_file_base_name", "meta", "quantizer", "mse", "is_marlin_format",
    "act_group_aware", "tokenizer", "dataset", "use_cuda_fp16", "model_seqlen",
    "block_name_to_quantize", "module_name_preceding_first_block", "batch_size", "pad_token_id",
    "use_exllama", "disable_exllama", "exllama_config", "max_input_length",
    "cache_block_outputs", "modules_in_block_to_quantize", "modules_to_not_convert", "backend",
    "v2", "v2_alpha", "parallel_packing", "offload_to_disk", "offload_to_disk_path"})
GPTQ_READ = frozenset({"bits", "group_size", "sym", "desc_act", "checkpoint_format", "format",
                       "lm_head", "pack_dtype", "dynamic", "adapter", "rotation"})
AWQ_KNOWN = frozenset({
    "quant_method", "bits", "w_bit", "group_size", "q_group_size", "zero_point", "version",
    "modules_to_not_convert", "backend", "do_fuse", "fuse_max_seq_len", "modules_to_fuse",
    "exllama_config"})

# block FP8 (DeepSeek-V3, Qwen3-FP8, transformers' FineGrainedFP8Config); `dequantize` is
# transformers' own loading option
FP8_KNOWN = frozenset({"quant_method", "fmt", "activation_scheme", "weight_block_size",
                       "ignored_layers", "modules_to_not_convert", "dequantize", "scale_fmt"})
# per-tensor FP8 (AutoFP8, llm-compressor's `fp8` export, vLLM's fp8 without blocks); AutoFP8
# writes kv_cache_scheme "static" beside its self_attn.k_scale / v_scale tensors, which the
# loader reads for any format (worker/kv_cache.py)
FP8_TENSOR_KNOWN = FP8_KNOWN | {"kv_cache_scheme"}


class Int4Format(QuantFormat):
    """A 4-bit format of `qweight` tensors with one scale (and zero) per group of inputs;
    group_size -1 is one group per output row (per channel)."""

    marker = "qweight"

    def __init__(self, group_size: int) -> None:
        self.group_size = group_size

    def groups(self, in_features: int) -> tuple[int, int]:
        """(group size, groups per row) for a linear of in_features inputs."""
        group = in_features if self.group_size == -1 else self.group_size
        check_groups(self.name, in_features, group)
        return group, in_features // group

    def linear(self, values: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
               perm: torch.Tensor | None, bias: torch.Tensor | None,
               dtype: torch.dtype) -> nn.Module:
        """W4A16Linear over unpacked values [N, K] and scales / zeros [N, groups]."""
        group = self.groups(values.shape[1])[0]
        return w4a16_linear(values, scales, zeros, perm, bias, group, dtype)


@register_format
class GptqFormat(Int4Format):
    """GPTQ 4-bit, symmetric or not, desc_act false or true: qweight int32 [K/8, N] (packed
    along K), qzeros int32 [K/group, N/8] (packed along N; checkpoint_format gptq stores
    zero - 1, gptq_v2 the zero itself), scales [K/group, N], g_idx [K] (the group of each
    input; act-order permutes them)."""

    name = "gptq"

    def __init__(self, group_size: int, zero_offset: int = 1) -> None:
        super().__init__(group_size)
        self.zero_offset = zero_offset

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> GptqFormat:
        """bits 4, group_size 32/64/128/-1, checkpoint_format gptq / gptq_v2, lm_head false,
        no per-module `dynamic` overrides, adapters or rotations."""
        fmt = cls(config.get("group_size"))
        refuse_unknown(fmt, config, GPTQ_BENIGN | GPTQ_READ)
        require(fmt, config, "bits", (4,))
        require(fmt, config, "group_size", (*GROUP_SIZES, -1))
        require(fmt, config, "sym", (True, False), True)
        require(fmt, config, "desc_act", (False, True), False)
        stored = require(fmt, config, "checkpoint_format", ("gptq", "gptq_v2"),
                         config.get("format", "gptq"))
        require(fmt, config, "lm_head", (False,), False)
        require(fmt, config, "pack_dtype", ("int32", "torch.int32"), "int32")
        for field in ("dynamic", "adapter", "rotation"):
            require(fmt, {field: config.get(field) or None}, field, (None,))
        fmt.zero_offset = 1 if stored == "gptq" else 0
        return fmt

    def tensor_specs(self, in_features: int, out_features: int) -> TensorSpecs:
        """qweight, qzeros, scales, g_idx as GPTQ stores them."""
        groups = self.groups(in_features)[1]
        return {"qweight": ((in_features // 8, out_features), torch.int32),
                "qzeros": ((groups, out_features // 8), torch.int32),
                "scales": ((groups, out_features), torch.float16),
                "g_idx": ((in_features,), torch.int32)}

    def convert(self, tensors, bias, dtype) -> nn.Module:
        """Repack along K per output row; act-order becomes an input permutation."""
        values = unpack_int4(tensors["qweight"].t().contiguous())  # [N, K]
        zeros = unpack_int4(tensors["qzeros"]).t() + self.zero_offset  # v1 stores zero - 1
        perm = act_order_perm(tensors["g_idx"], self.groups(values.shape[1])[0])
        if perm is not None:
            values = values[:, perm]
        return self.linear(values, tensors["scales"].t(), zeros, perm, bias, dtype)


@register_format
class AwqFormat(Int4Format):
    """AWQ 4-bit GEMM layout with zero points: qweight int32 [K, N/8] and qzeros [K/group,
    N/8], packed along N in the interleaved order 0 2 4 6 1 3 5 7; scales [K/group, N]."""

    name = "awq"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> AwqFormat:
        """bits 4, group_size 32/64/128/-1, zero_point true, version gemm."""
        fmt = cls(config.get("group_size", config.get("q_group_size")))
        refuse_unknown(fmt, config, AWQ_KNOWN)
        require(fmt, {"bits": config.get("bits", config.get("w_bit"))}, "bits", (4,))
        require(fmt, {"group_size": fmt.group_size}, "group_size", (*GROUP_SIZES, -1))
        require(fmt, config, "zero_point", (True,), True)
        require(fmt, {"version": str(config.get("version", "gemm")).lower()}, "version",
                ("gemm",))
        return fmt

    def tensor_specs(self, in_features: int, out_features: int) -> TensorSpecs:
        """qweight, qzeros, scales as AWQ stores them."""
        groups = self.groups(in_features)[1]
        return {"qweight": ((in_features, out_features // 8), torch.int32),
                "qzeros": ((groups, out_features // 8), torch.int32),
                "scales": ((groups, out_features), torch.float16)}

    def convert(self, tensors, bias, dtype) -> nn.Module:
        """Undo the interleave and repack along K per output row."""
        values = unpack_int4(tensors["qweight"], AWQ_UNPACK_ORDER).t()  # [N, K]
        zeros = unpack_int4(tensors["qzeros"], AWQ_UNPACK_ORDER).t()
        return self.linear(values, tensors["scales"].t(), zeros, None, bias, dtype)


@register_format
class BlockFp8Format(QuantFormat):
    """FP8 e4m3 weights in 128x128 blocks (DeepSeek-V3 / Qwen3-FP8): weight [N, K],
    weight_scale_inv float32 [ceil(N/128), ceil(K/128)]; activations quantized per token and
    group of 128 inputs."""

    name = "fp8"
    marker = "weight_scale_inv"
    moe_field = None  # routed experts too: moe_fp8.py
    block = (128, 128)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> QuantFormat:
        """weight_block_size [128, 128], fmt e4m3, activation_scheme dynamic; without a
        weight_block_size, per-tensor FP8 (PerTensorFp8Format), as vLLM's fp8 method reads."""
        if config.get("weight_block_size") is None:
            return PerTensorFp8Format.from_config(config)
        fmt = cls()
        refuse_unknown(fmt, config, FP8_KNOWN)
        block = config.get("weight_block_size")
        require(fmt, {"weight_block_size": None if block is None else tuple(block)},
                "weight_block_size", (cls.block,))
        require(fmt, config, "fmt", ("e4m3",), "e4m3")
        require(fmt, config, "activation_scheme", ("dynamic",), "dynamic")
        # ue8m0 (DeepSeek-V3.2): the block scales are powers of two, stored as
        # float8_e8m0fnu (or float32); either reads into the float32 spec exactly
        require(fmt, config, "scale_fmt", ("float", "ue8m0", None), "float")
        return fmt

    def tensor_specs(self, in_features: int, out_features: int) -> TensorSpecs:
        """weight (e4m3) and weight_scale_inv per block."""
        check_groups(self.name, in_features, self.block[1])  # activations: whole groups
        rows, cols = (-(-out_features // self.block[0]), -(-in_features // self.block[1]))
        return {"weight": ((out_features, in_features), torch.float8_e4m3fn),
                "weight_scale_inv": ((rows, cols), torch.float32)}

    def convert(self, tensors, bias, dtype) -> nn.Module:
        """Block scales expanded to one row per output (row-sliceable when fused)."""
        weight = tensors["weight"]
        scale = tensors["weight_scale_inv"].repeat_interleave(self.block[0], dim=0)
        return BlockFp8Linear(weight, scale[: weight.shape[0]].contiguous(), bias)


class PerTensorFp8Format(QuantFormat):
    """FP8 e4m3 weights with one scale per tensor (quant_method fp8 without weight_block_size:
    AutoFP8, vLLM): weight [N, K], weight_scale float32 [1] or a scalar and, with activation_scheme
    static, a calibrated input_scale float32 [1] or a scalar; dynamic activations are quantized
    per token. The ignored_layers / modules_to_not_convert store a plain weight (no
    weight_scale) and stay unquantized. Per-channel weight scales are refused, as vLLM does."""

    name = "fp8"
    moe_field = "weight_block_size"  # per-tensor experts: not yet

    def __init__(self, static: bool = False) -> None:
        self.static = static

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> PerTensorFp8Format:
        """fmt e4m3, activation_scheme dynamic or static, kv_cache_scheme absent or static,
        the ignored layers a list of module names."""
        fmt = cls()
        refuse_unknown(fmt, config, FP8_TENSOR_KNOWN)
        require(fmt, config, "fmt", ("e4m3",), "e4m3")
        scheme = require(fmt, config, "activation_scheme", ("dynamic", "static"), "dynamic")
        require(fmt, config, "kv_cache_scheme", (None, "static"))
        for field in ("ignored_layers", "modules_to_not_convert"):
            names = config.get(field)
            if names is not None and not (isinstance(names, list)
                                          and all(isinstance(n, str) for n in names)):
                fmt.refuse(field, names, "a list of module names")
        fmt.static = scheme == "static"
        return fmt

    def tensor_specs(self, in_features: int, out_features: int) -> TensorSpecs:
        """weight (e4m3), weight_scale and (static) input_scale: one value each."""
        specs = {"weight": ((out_features, in_features), torch.float8_e4m3fn),
                 "weight_scale": ((1,), torch.float32)}
        if self.static:
            specs["input_scale"] = ((1,), torch.float32)
        return specs

    def convert(self, tensors, bias, dtype) -> nn.Module:
        """The per-tensor scale repeated per row (row-sliceable when q/k/v or gate/up fuse,
        each shard keeping its own): a StaticFp8Linear or DynamicFp8Linear."""
        weight = tensors["weight"]
        scale = tensors["weight_scale"].reshape(1, 1).expand(weight.shape[0], 1)
        if self.static:
            return StaticFp8Linear(weight, scale, tensors["input_scale"], bias)
        return DynamicFp8Linear(weight, scale, bias)
