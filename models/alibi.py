"""ALiBi's per-head slopes (Bloom's and Falcon's geometric series, MPT's alibi_bias_max form):
the attention op adds slope_h * (key position - query position) to each score."""

from __future__ import annotations

import math

import torch


def bloom_alibi_slopes(num_heads: int) -> torch.Tensor:
    """[num_heads] float32: 2^(-8i/n) for the largest power of two n <= num_heads, then the
    odd powers of the next power of two's base for the rest (transformers' Bloom and Falcon)."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = 2.0 ** (-(2.0 ** -(math.log2(closest) - 3)))
    slopes = [base**power for power in range(1, closest + 1)]
    if closest != num_heads:
        extra_base = 2.0 ** (-(2.0 ** -(math.log2(2 * closest) - 3)))
        remaining = min(closest, num_heads - closest)
        slopes += [extra_base**power for power in range(1, 2 * remaining, 2)]
    return torch.tensor(slopes, dtype=torch.float32)


def mpt_alibi_slopes(num_heads: int, alibi_bias_max: float = 8.0) -> torch.Tensor:
    """[num_heads] float32: 2^-(i * max / n) over the next power of two n, its odd then even
    entries where num_heads is not one (transformers' MPT)."""
    padded = 2 ** math.ceil(math.log2(num_heads))
    base = torch.arange(1, padded + 1, dtype=torch.int64).float() * (alibi_bias_max / padded)
    slopes = 1.0 / torch.pow(2, base)
    if padded != num_heads:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:num_heads]
    return slopes
