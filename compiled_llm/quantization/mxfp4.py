"""MXFP4 checkpoints (quant_method "mxfp4": GPT-OSS's routed experts): each `<name>_blocks`
holds FP4 (E2M1) values two to a byte, low nibble first, and `<name>_scales` one power of two
(E8M0, bias 127) per 32 of them. They are dequantized as they are read into the tensor the
unquantized checkpoint stores as `<name>`, exactly (an FP4 value times a power of two is a
bfloat16), so those experts run on the bf16 fused MoE kernels."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch

from compiled_llm.quantization.registry import QuantFormat, refuse_unknown, register_format

FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
SUFFIXES = ("_blocks", "_scales")
# what transformers' Mxfp4Config writes that does not change the stored weights' meaning
KNOWN = frozenset({"quant_method", "modules_to_not_convert", "dequantize"})


@register_format
class Mxfp4Format(QuantFormat):
    """MXFP4 expert tensors, dequantized at load (no module is swapped)."""

    name = "mxfp4"
    marker = "_blocks"
    dequantizes_at_load: ClassVar[bool] = True

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Mxfp4Format:
        """Validate quantization_config (ValueError naming an unknown field)."""
        fmt = cls()
        refuse_unknown(fmt, config, KNOWN)
        return fmt

    def tensor_stream(self, stream: Iterable[tuple[str, torch.Tensor, Path]]
                      ) -> Iterator[tuple[str, torch.Tensor, Path]]:
        """The checkpoint's (name, tensor, path) with each blocks / scales pair replaced by
        its dequantized tensor under the pair's name; ValueError for a half left unpaired."""
        pending: dict[str, tuple[str, torch.Tensor]] = {}
        plain: set[str] = set()  # names stored unquantized: none may also come as a pair
        for name, tensor, path in stream:
            suffix = next((s for s in SUFFIXES if name.endswith(s)), None)
            if suffix is None:
                _check_once(name, plain)
                yield name, tensor, path
                continue
            base = name.removesuffix(suffix)
            if base not in pending:
                pending[base] = (suffix, tensor)
                continue
            other_suffix, other = pending.pop(base)
            if other_suffix == suffix:
                raise ValueError(f"mxfp4 checkpoint: {name!r} is stored twice")
            blocks, scales = (tensor, other) if suffix == "_blocks" else (other, tensor)
            _check_once(base, plain)
            yield base, dequantize_mxfp4(blocks, scales, base), path
        if pending:
            base, (suffix, _) = next(iter(pending.items()))
            missing = SUFFIXES[suffix == "_blocks"]
            raise ValueError(f"mxfp4 checkpoint: {base + suffix!r} has no {base + missing!r}")


def _check_once(name: str, seen: set[str]) -> None:
    """ValueError for a tensor stored both unquantized and as an MXFP4 pair."""
    if name in seen:
        raise ValueError(f"mxfp4 checkpoint: {name!r} is stored both unquantized and as "
                         f"{name + '_blocks'!r} / {name + '_scales'!r}")
    seen.add(name)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, name: str = "tensor",
                     dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """blocks uint8 [E, R, G, 16] and scales [E, R, G] (uint8 or E8M0) -> [E, G * 32, R] in
    dtype: value 2j of a group is byte j's low nibble, 2j + 1 its high one, times
    2^(scale - 127); transposed as the unquantized expert tensor is stored ([E, in, out]).
    One expert at a time: a whole layer's float32 products would not fit beside the model."""
    scale_types = (torch.uint8, getattr(torch, "float8_e8m0fnu", torch.uint8))
    if blocks.dtype != torch.uint8 or scales.dtype not in scale_types:
        raise ValueError(f"mxfp4 checkpoint: {name} has blocks of {blocks.dtype} and scales "
                         f"of {scales.dtype}; expected uint8 blocks and uint8 (E8M0) scales")
    if blocks.dim() != 4 or blocks.shape[-1] != 16 or tuple(scales.shape) != blocks.shape[:-1]:
        raise ValueError(f"mxfp4 checkpoint: {name} has blocks {tuple(blocks.shape)} and "
                         f"scales {tuple(scales.shape)}; expected [E, R, G, 16] and [E, R, G]")
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32, device=blocks.device)
    exponents = scales.view(torch.uint8).to(torch.int32) - 127
    experts, rows, groups, _ = blocks.shape
    out = torch.empty(experts, groups * 32, rows, dtype=dtype, device=blocks.device)
    for expert in range(experts):
        codes = blocks[expert].to(torch.int64)  # [R, G, 16]
        values = torch.stack([lut[codes & 0x0F], lut[codes >> 4]], -1)  # [R, G, 16, 2]
        values = values.flatten(-2) * torch.exp2(exponents[expert].float())[..., None]
        out[expert] = values.flatten(1).t()  # [R, G * 32] -> [in, out]
    return out
