"""Tensor-parallel sharding of an attention whose heads the sharder's own attention() cannot
size: q/k/v heads of their own widths (MiMo-V2-Flash's narrower values), a layer's own KV head
count, per-head sinks and output gates; through the primitives of the sharder it is given."""

from __future__ import annotations

from torch import nn

from compiled_llm.models.tp_helpers import rank_heads


def shard_heads(sharder, prefix: str, attn: nn.Module, qk_dim: int, v_dim: int,
                gates: tuple[str, ...] = ()) -> tuple[int, int]:
    """q_proj (and each per-head gate linear in `gates`) by this rank's query heads' rows in
    qk_dim (v_dim for a gate), k_proj / v_proj by the rows of the KV heads they read of the
    layer's attn.num_kv_heads, o_proj by v_dim columns, a `sinks` parameter's entries; attn's
    num_heads / num_kv_heads become this rank's. Returns this rank's (query, KV) head counts."""
    first, count = sharder.query_heads()
    kv_first, kv_count = rank_heads(sharder, attn.num_kv_heads, "the layer's KV heads")
    sharder.column(f"{prefix}.q_proj", attn.q_proj, first * qk_dim, count * qk_dim)
    for name, dim in (("k_proj", qk_dim), ("v_proj", v_dim)):
        sharder.column(f"{prefix}.{name}", getattr(attn, name), kv_first * dim, kv_count * dim)
    for name in gates:
        sharder.column(f"{prefix}.{name}", getattr(attn, name), first * v_dim, count * v_dim)
    sharder.row(f"{prefix}.o_proj", attn.o_proj, first * v_dim, count * v_dim)
    if isinstance(getattr(attn, "sinks", None), nn.Parameter):  # a logit per query head
        sharder.keep(prefix, attn, "sinks", (count,), dim=0, start=first, size=count)
    attn.num_heads, attn.num_kv_heads = count, kv_count
    return count, kv_count
