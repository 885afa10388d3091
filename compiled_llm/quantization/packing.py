"""4-bit packing shared by the W4A16 formats: the one layout the kernels read.

Canonical layout: qweight int32 [N, K // 8], eight unsigned 4-bit values per word along K, the
value for k = 8 * word + j in bits [4j, 4j + 4) (low nibble first); scales and zeros (uint8)
[N, K // group], so that W[n, k] = (q[n, k] - zeros[n, g]) * scales[n, g] with g = k // group.
"""

from __future__ import annotations

import torch

PACK = 8  # 4-bit values per int32
SHIFTS = tuple(range(0, 32, 4))


def unpack_int4(packed: torch.Tensor, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """int32 [R, C] -> uint8 [R, C * 8], unpacking each word along the last dim low nibble
    first; `order[j]` names the nibble holding the word's j-th value (AWQ's interleave)."""
    shifts = torch.tensor(SHIFTS, dtype=torch.int32, device=packed.device)
    if order is not None:
        shifts = shifts[list(order)]
    values = (packed.unsqueeze(-1) >> shifts) & 0xF
    return values.reshape(*packed.shape[:-1], -1).to(torch.uint8)


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """uint8 [R, C] (values 0..15, C % 8 == 0) -> int32 [R, C // 8] in the canonical layout."""
    words = values.to(torch.int32).reshape(*values.shape[:-1], -1, PACK)
    shifts = torch.tensor(SHIFTS, dtype=torch.int32, device=values.device)
    # bits 28..31 of the top nibble make the word negative where needed: int32 wraps, as wanted
    return (words << shifts).sum(-1, dtype=torch.int32)


def dequantize_int4(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                    group_size: int) -> torch.Tensor:
    """Canonical (qweight, scales, zeros) -> W [N, K] in scales' dtype."""
    values = unpack_int4(qweight)
    expand = lambda t: t.repeat_interleave(group_size, dim=1)  # noqa: E731
    return (values.to(scales.dtype) - expand(zeros).to(scales.dtype)) * expand(scales)


def kernel_groups(scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
                  in_features: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(scales, zeros, group_size) with one group per row (per-channel, `group_size: -1`)
    spread over groups of 128 where K allows: the same weight, in the group size that the
    kernels (tinygemm's included) are tuned for."""
    if group_size != in_features or in_features % 128 or in_features == 128:
        return scales, zeros, group_size
    repeat = in_features // 128
    return (scales.repeat_interleave(repeat, dim=1), zeros.repeat_interleave(repeat, dim=1),
            128)


def check_groups(fmt_name: str, in_features: int, group_size: int) -> None:
    """ValueError unless whole groups of `group_size` inputs cover in_features (vLLM refuses
    such layers too: the last group would be partial)."""
    if in_features % group_size:
        raise ValueError(f"{fmt_name} checkpoint: in_features={in_features} is not a multiple "
                         f"of quantization_config group_size={group_size}")


def act_order_perm(g_idx: torch.Tensor, group_size: int) -> torch.Tensor | None:
    """The input order that makes GPTQ groups contiguous (None: already in order); ValueError
    unless every group holds exactly group_size inputs."""
    perm = torch.argsort(g_idx.long(), stable=True)
    expected = torch.arange(g_idx.numel(), device=g_idx.device) // group_size
    if not torch.equal(g_idx.long()[perm], expected):
        raise ValueError("gptq checkpoint: g_idx does not give every group group_size inputs")
    return None if torch.equal(perm, torch.arange(perm.numel(), device=perm.device)) else perm
