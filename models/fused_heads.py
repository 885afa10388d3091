"""Tensor-parallel sharding of the classic decoders' attention layouts, from their modules'
shard_for_tp through the primitives of the sharder it is given (distributed/tensor_parallel.py):
one projection per KV group ([G, q_per_group + 2, D]: GPT-NeoX, Persimmon, Bloom, Falcon,
GPTBigCode), a q | k | v stack (MPT's Wqkv, GPT-2's c_attn), q/k/v under another output name
(OPT, GPT-J, GPT-Neo, Phi), per-head ALiBi slopes, Conv1D weights ([in, out]: dims flipped)."""

from __future__ import annotations

import dataclasses

from torch import nn


def keep_heads(sharder, attn: nn.Module) -> None:
    """The module's own head counts become this rank's (its forward views by them), and a
    per-head ALiBi slopes buffer keeps this rank's query heads' entries."""
    first, count = sharder.query_heads()
    attn.num_heads = count
    if hasattr(attn, "num_kv_heads"):
        attn.num_kv_heads = sharder.heads.num_kv_heads
    slopes = getattr(attn, "alibi_slopes", None)
    if slopes is not None:
        attn.alibi_slopes = slopes[first:first + count].clone()


def shard_grouped_qkv(sharder, prefix: str, attn: nn.Module, qkv: str, out: str) -> None:
    """query_key_value's rows as [G, q_per_group + 2, D] (q heads of the group, then its k and
    v; per-head [H, 3, D] is G = H): with at least as many groups as ranks, this rank's whole
    groups (one contiguous run); with fewer (Falcon's multi-query), its q heads' rows and its
    group's k and v rows, so each rank holds one group [1, count + 2, D]. `out` by columns."""
    heads, dim = sharder.heads, sharder.head_dim
    groups = sharder.model.config.num_key_value_heads  # the whole model's (G)
    per_group = attn.num_heads // groups
    width = (per_group + 2) * dim  # one group's rows
    linear, first, count = getattr(attn, qkv), *sharder.query_heads()
    if heads.num_kv_heads * sharder.tp.world_size == groups:  # whole groups per rank
        sharder.column(f"{prefix}.{qkv}", linear, heads.first_kv_head * width,
                       heads.num_kv_heads * width)
    else:  # one group shared by several ranks: its k and v replicated on each
        base, group = heads.first_kv_head * width, heads.first_kv_head * per_group
        sharder.fused_column(f"{prefix}.{qkv}", linear, [
            (base, (first - group) * dim, count * dim), (base, per_group * dim, dim),
            (base, (per_group + 1) * dim, dim)])
    sharder.row(f"{prefix}.{out}", getattr(attn, out), first * dim, count * dim)
    keep_heads(sharder, attn)


def shard_stacked_qkv(sharder, prefix: str, attn: nn.Module, qkv: str, out: str) -> None:
    """A multi-head q | k | v stack ([3, H, D] rows: MPT's Wqkv, GPT-2's c_attn): this rank's
    heads' rows of each part; `out` by columns."""
    first, count = sharder.query_heads()
    dim, full = sharder.head_dim, attn.num_heads * sharder.head_dim
    sharder.fused_column(f"{prefix}.{qkv}", getattr(attn, qkv),
                         [(part * full, first * dim, count * dim) for part in range(3)])
    sharder.row(f"{prefix}.{out}", getattr(attn, out), first * dim, count * dim)
    keep_heads(sharder, attn)


def shard_split_attention(sharder, prefix: str, attn: nn.Module, out: str) -> None:
    """Separate q/k/v_proj and an output projection named `out` (OPT's and GPT-J's out_proj,
    Phi's dense): the sharder's own attention split under that output name."""
    sharder.attention(prefix, attn, out)


def transpose_weights(sharder, names: list[str]) -> None:
    """The plan's Shards of Conv1D weights (checkpoint [in, out], our nn.Linear's [out, in]
    transposed): each part's dim flipped, so the loader reads the checkpoint's columns."""
    def flip(shard):  # a Shard (distributed/shards.py): rows along `dim`
        return dataclasses.replace(shard, dim=1 - shard.dim)

    for name in names:
        shard = sharder.plan[f"{name}.weight"]
        sharder.plan[f"{name}.weight"] = (  # a FusedShard's parts each flipped
            dataclasses.replace(shard, parts=tuple(map(flip, shard.parts)))
            if hasattr(shard, "parts") else flip(shard))
