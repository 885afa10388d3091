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
