"""What a tensor-parallel rank reads of each checkpoint tensor: a Shard (rows along one dim), a
FusedShard (rows of each part of a fused tensor), a PaddedShard (rows past the end read as
zeros) or a ZeroShard (zeros: a bias the ranks' partial sums must add only once); read_index,
which reads any of them from a tensor or a safetensors slice; plan_index, the loader's view."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class Shard:
    """Rows [start, start + size) along `dim` of a checkpoint tensor (its own coordinates)."""

    dim: int
    start: int
    size: int

    def index(self) -> tuple[slice, ...]:
        """The index that reads this shard (safetensors get_slice or a tensor)."""
        return (slice(None),) * self.dim + (slice(self.start, self.start + self.size),)


@dataclass(frozen=True)
class FusedShard:
    """A rank's rows of each part of a fused checkpoint tensor (q, k, v of qkv_proj; gate, up of
    gate_up_proj; a stacked [E, H, 2I] gate_up_proj's along dim 2), read part by part and
    concatenated along the parts' (one) dim in that order."""

    parts: tuple[Shard, ...]
    offsets: tuple[int, ...] = ()  # each part's first row in the fused tensor, where known

    def index(self) -> list[tuple[slice, ...]]:
        """One index per part (read_index concatenates what they read)."""
        return [part.index() for part in self.parts]

    def part(self, which: int) -> Shard:
        """Part `which` in the coordinates of a checkpoint that stores it as its own tensor."""
        shard = self.parts[which]
        return Shard(shard.dim, shard.start - self.offsets[which], shard.size)


@dataclass(frozen=True)
class PaddedIndex:
    """Rows `index` (along dim 0) of a tensor, then zero rows up to `rows` in all."""

    index: tuple[slice, ...]
    rows: int


@dataclass(frozen=True)
class PaddedShard(Shard):
    """A Shard of dim 0 past the tensor's end (`available` of its rows exist): the rest read as
    zeros (the last ranks' rows of a vocabulary the ranks cannot split evenly)."""

    available: int = 0

    def index(self) -> PaddedIndex:
        """Read the available rows, then pad."""
        return PaddedIndex((slice(self.start, self.start + self.available),), self.size)


@dataclass(frozen=True)
class ZeroIndex:
    """The whole tensor's shape, read as zeros."""


@dataclass(frozen=True)
class ZeroShard:
    """Zeros in the tensor's shape: a bias added after a reduction's partial sums (GPT-OSS's
    experts' down bias) held by one rank, zero on the others, so the sum adds it once."""

    def index(self) -> ZeroIndex:
        """The marker read_index reads as zeros."""
        return ZeroIndex()


def read_index(source, index) -> torch.Tensor:
    """source[index] (a tensor or a safetensors slice); a FusedShard's list of indices reads
    each part and concatenates them along the dim they slice; a PaddedIndex pads with zero rows; a
    ZeroIndex reads zeros of the whole tensor's shape."""
    if isinstance(index, list):
        return torch.cat([source[part] for part in index], dim=len(index[0]) - 1)
    if isinstance(index, PaddedIndex):
        rows = source[index.index]
        pad = rows.new_zeros((index.rows - rows.shape[0], *rows.shape[1:]))
        return torch.cat([rows, pad])
    if isinstance(index, ZeroIndex):
        return torch.zeros_like(source[:])
    return source[index]


def plan_index(model: nn.Module, plan: dict[str, Shard | FusedShard]):
    """index_of(checkpoint name) for the loader: the slice this rank reads (a list of slices
    for a fused tensor's parts, read by read_index), or None (whole)."""

    def index_of(hf_name: str) -> tuple[slice, ...] | list[tuple[slice, ...]] | None:
        target = model.weight_name(hf_name)
        ours = target if target is None or isinstance(target, str) else target.name
        shard = plan.get(ours) if ours is not None else None
        if isinstance(shard, FusedShard) and shard.offsets and hasattr(target, "part"):
            shard = shard.part(target.part)  # a fused parameter's part stored on its own
        return None if shard is None else shard.index()

    return index_of
