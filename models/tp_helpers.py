"""What models' shard_for_tp share beyond the sharder's primitives (models may not import the
distributed layer): a rank's share of heads laid out as the sharder lays them, per-token sums
over a dimension the ranks split (RowSum, whose output the sharder all-reduces) and the RMSNorm
over such a dimension built on them."""

from __future__ import annotations

import torch
from torch import nn


def rank_heads(sharder, num_heads: int, what: str) -> tuple[int, int]:
    """(first, count) of this rank's heads of `num_heads`: an even share, or where there are
    fewer heads than ranks (KV heads) the one this rank's query heads read, replicated (as the
    sharder's head_layout does); ValueError naming `what` if neither divides."""
    world, rank = sharder.tp.world_size, sharder.tp.rank
    if num_heads >= world:
        return sharder.split(num_heads, what)
    if world % num_heads:
        raise ValueError(f"tensor_parallel_size {world} must be a multiple of {what} "
                         f"{num_heads} (or divide it)")
    return rank // (world // num_heads), 1


def check_heads(world: int, num_heads: int, what: str) -> None:
    """ValueError naming tensor_parallel_size unless `world` divides num_heads or is a
    multiple of it (checked before any rank starts)."""
    if num_heads % world if num_heads >= world else world % num_heads:
        raise ValueError(f"tensor_parallel_size {world} must divide {what} {num_heads} (or be "
                         "a multiple of it)")


class RowSum(nn.Module):
    """x [..., N] -> its rows' sums [..., 1] (a module: tensor parallelism all-reduces its
    output, so the sum spans every rank's slice of N)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., N] -> [..., 1]."""
        return x.sum(-1, keepdim=True)


class SplitRMSNorm(nn.Module):
    """models.layers.RMSNorm (float32, cast, then scaled) over a dimension of `width` of which
    this rank holds a slice (and its weight's): the mean square from all-reduced sums."""

    def __init__(self, size: int, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.width, self.eps, self.sum_sq = width, eps, RowSum()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., size] -> the same shape and dtype."""
        hidden_f32 = hidden.float()
        mean_sq = self.sum_sq(hidden_f32.pow(2)) / self.width
        return self.weight * (hidden_f32 * torch.rsqrt(mean_sq + self.eps)).to(hidden.dtype)


def split_rms_norm(sharder, owner: nn.Module, name: str, prefix: str, start: int,
                   size: int) -> None:
    """Replace owner's RMSNorm `name` (over a dimension the ranks split) by a SplitRMSNorm
    keeping rows [start, start + size) of its weight."""
    norm = getattr(owner, name)
    split = SplitRMSNorm(size, norm.weight.shape[0], norm.eps)
    setattr(owner, name, split)
    sharder.keep(f"{prefix}.{name}", split, "weight", (size,), dim=0, start=start, size=size)
    sharder.reduce(split.sum_sq)
