"""GPTQ, AWQ and block-FP8 checkpoints: their stored tensors (each class says the layout) and
the conversion to the modules that run them (compressed-tensors lives in compressed_tensors.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from compiled_llm.quantization import compressed_tensors  # noqa: F401 (registers it)
from compiled_llm.quantization.packing import pack_int4, unpack_int4
from compiled_llm.quantization.registry import QuantFormat, TensorSpecs, register_format, require
from compiled_llm.quantization.w4a16 import W4A16Linear
from compiled_llm.quantization.w8a8 import BlockFp8Linear

GROUP_SIZES = (32, 64, 128)
AWQ_UNPACK_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # value j of a word sits in nibble AWQ_UNPACK_ORDER[j]


def act_order_perm(g_idx: torch.Tensor, group_size: int) -> torch.Tensor | None:
    """The input order that makes GPTQ groups contiguous (None: already in order); ValueError
    unless every group holds exactly group_size inputs."""
    perm = torch.argsort(g_idx.long(), stable=True)
    expected = torch.arange(g_idx.numel(), device=g_idx.device) // group_size
    if not torch.equal(g_idx.long()[perm], expected):
        raise ValueError("gptq checkpoint: g_idx does not give every group group_size inputs")
    return None if torch.equal(perm, torch.arange(perm.numel(), device=perm.device)) else perm


class Int4Format(QuantFormat):
    """A 4-bit format of `qweight` tensors with one scale (and zero) per group of inputs."""

    marker = "qweight"

    def __init__(self, group_size: int) -> None:
        self.group_size = group_size


@register_format
class GptqFormat(Int4Format):
    """GPTQ 4-bit, symmetric, desc_act false or true: qweight int32 [K/8, N] (packed along K),
    qzeros int32 [K/group, N/8] (packed along N, stored as zero - 1), scales [K/group, N], g_idx
    [K] (the group of each input; act-order permutes them)."""

    name = "gptq"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> GptqFormat:
        """bits 4, group_size 32/64/128, sym true, checkpoint_format gptq, lm_head false."""
        fmt = cls(config.get("group_size"))
        require(fmt, config, "bits", (4,))
        require(fmt, config, "group_size", GROUP_SIZES)
        require(fmt, config, "sym", (True,), True)
        require(fmt, config, "desc_act", (False, True), False)
        require(fmt, config, "checkpoint_format", ("gptq",), "gptq")
        require(fmt, config, "lm_head", (False,), False)
        return fmt

    def tensor_specs(self, in_features: int, out_features: int) -> TensorSpecs:
        """qweight, qzeros, scales, g_idx as GPTQ stores them."""
        groups = in_features // self.group_size
        return {"qweight": ((in_features // 8, out_features), torch.int32),
                "qzeros": ((groups, out_features // 8), torch.int32),
                "scales": ((groups, out_features), torch.float16),
                "g_idx": ((in_features,), torch.int32)}

    def convert(self, tensors, bias, dtype) -> nn.Module:
        """Repack along K per output row; act-order becomes an input permutation."""
        values = unpack_int4(tensors["qweight"].t().contiguous())  # [N, K]
        zeros = unpack_int4(tensors["qzeros"]).t() + 1  # GPTQ stores zero - 1
        perm = act_order_perm(tensors["g_idx"], self.group_size)
        if perm is not None:
            values = values[:, perm]
        return W4A16Linear(pack_int4(values), tensors["scales"].t().to(dtype), zeros, perm,
                           bias, self.group_size)


@register_format
class AwqFormat(Int4Format):
    """AWQ 4-bit GEMM layout with zero points: qweight int32 [K, N/8] and qzeros [K/group,
    N/8], packed along N in the interleaved order 0 2 4 6 1 3 5 7; scales [K/group, N]."""

    name = "awq"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> AwqFormat:
        """bits 4, group_size 32/64/128, zero_point true, version gemm."""
        fmt = cls(config.get("group_size", config.get("q_group_size")))
        require(fmt, {"bits": config.get("bits", config.get("w_bit"))}, "bits", (4,))
        require(fmt, {"group_size": fmt.group_size}, "group_size", GROUP_SIZES)
        require(fmt, config, "zero_point", (True,), True)
        require(fmt, {"version": str(config.get("version", "gemm")).lower()}, "version",
                ("gemm",))
        return fmt

    def tensor_specs(self, in_features: int, out_features: int) -> TensorSpecs:
        """qweight, qzeros, scales as AWQ stores them."""
        groups = in_features // self.group_size
        return {"qweight": ((in_features, out_features // 8), torch.int32),
                "qzeros": ((groups, out_features // 8), torch.int32),
                "scales": ((groups, out_features), torch.float16)}

    def convert(self, tensors, bias, dtype) -> nn.Module:
        """Undo the interleave and repack along K per output row."""
        values = unpack_int4(tensors["qweight"], AWQ_UNPACK_ORDER).t()  # [N, K]
        zeros = unpack_int4(tensors["qzeros"], AWQ_UNPACK_ORDER).t()
        return W4A16Linear(pack_int4(values.contiguous()), tensors["scales"].t().to(dtype),
                           zeros, None, bias, self.group_size)


@register_format
class BlockFp8Format(QuantFormat):
    """FP8 e4m3 weights in 128x128 blocks (DeepSeek-V3 / Qwen3-FP8): weight [N, K],
    weight_scale_inv float32 [ceil(N/128), ceil(K/128)]; activations quantized per token and
    group of 128 inputs."""

    name = "fp8"
    marker = "weight_scale_inv"
    block = (128, 128)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> BlockFp8Format:
        """weight_block_size [128, 128], fmt e4m3, activation_scheme dynamic."""
        fmt = cls()
        block = config.get("weight_block_size")
        require(fmt, {"weight_block_size": None if block is None else tuple(block)},
                "weight_block_size", (cls.block,))
        require(fmt, config, "fmt", ("e4m3",), "e4m3")
        require(fmt, config, "activation_scheme", ("dynamic",), "dynamic")
        return fmt

    def tensor_specs(self, in_features: int, out_features: int) -> TensorSpecs:
        """weight (e4m3) and weight_scale_inv per block."""
        rows, cols = (-(-out_features // self.block[0]), -(-in_features // self.block[1]))
        return {"weight": ((out_features, in_features), torch.float8_e4m3fn),
                "weight_scale_inv": ((rows, cols), torch.float32)}

    def convert(self, tensors, bias, dtype) -> nn.Module:
        """Block scales expanded to one row per output (row-sliceable when fused)."""
        weight = tensors["weight"]
        scale = tensors["weight_scale_inv"].repeat_interleave(self.block[0], dim=0)
        return BlockFp8Linear(weight, scale[: weight.shape[0]].contiguous(), bias)
