"""Tensor parallelism of Gemma 4 and Gemma 3n (their modules' shard_for_tp): attention by heads
in each layer's own shape (the full layers' KV heads and head dim), the MLPs and routed experts
by intermediate rows, the experts' output all-reduced before its norm, Gemma 3n's sparsity
statistics summed over the ranks; per-layer embeddings, AltUp and Laurel stay replicated."""

from __future__ import annotations

import dataclasses

from torch import nn

from compiled_llm.models.tp_helpers import check_heads, rank_heads


def shard_attention(attn: nn.Module, sharder, prefix: str) -> None:
    """q_proj by this rank's query heads' rows, o_proj by their columns, k_proj / v_proj (where
    the layer writes a cache) by its KV heads' rows, in the layer's head dim; q/k norms are per
    head (whole). A full layer's per-rank KV heads go to the config's global_kv_heads, which
    sizes its cache (and, on a KV-shared layer, the source's cache it reads)."""
    config, dim = sharder.model.config, attn.head_dim
    first, count = sharder.query_heads()
    kv_first, kv_count = rank_heads(sharder, attn.num_kv_heads, "num_global_key_value_heads")
    sharder.column(f"{prefix}.q_proj", attn.q_proj, first * dim, count * dim)
    sharder.row(f"{prefix}.o_proj", attn.o_proj, first * dim, count * dim)
    for name in ("k_proj", "v_proj"):
        if hasattr(attn, name):
            sharder.column(f"{prefix}.{name}", getattr(attn, name), kv_first * dim,
                           kv_count * dim)
    attn.num_heads, attn.num_kv_heads = count, kv_count
    if not config.is_sliding(attn.layer_idx):
        sharder.model.config = dataclasses.replace(config, global_kv_heads=kv_count)


def shard_layer(layer: nn.Module, sharder, prefix: str) -> None:
    """Gemma 4's layer: its attention, the dense MLP (all-reduced by down_proj) and the
    routed experts (intermediate rows of every expert, or whole experts under expert
    parallelism), their sum all-reduced before post_feedforward_layernorm_2 reads it."""
    shard_attention(layer.self_attn, sharder, f"{prefix}.self_attn")
    sharder.mlp(f"{prefix}.mlp", layer.mlp)
    if layer.experts is None:
        return
    if sharder.expert_parallel:
        sharder.whole_experts(f"{prefix}.experts", layer.experts)
    else:  # the checkpoint's gate_up_proj [E, 2I, H], down_proj [E, H, I]
        sharder.expert_slices(prefix, layer.experts, stacked=True)
    sharder.reduce(layer.experts)


def shard_sparse_mlp(mlp: nn.Module, sharder, prefix: str) -> None:
    """Gemma 3n's MLP by intermediate rows; on a layer with activation sparsity the per-token
    sums its gate statistics take (gate_sum) are all-reduced, so each rank cuts its slice of
    the gate at the whole row's mean + std * icdf(sparsity)."""
    sharder.mlp(prefix, mlp)
    if mlp.std_multiplier is not None:
        sharder.reduce(mlp.gate_sum)


def check_tensor_parallel(config, world: int) -> None:
    """ValueError naming tensor_parallel_size where the ranks cannot split the full layers'
    KV heads or a layer's MLP width (the sliding layers' heads: check_shardable)."""
    check_heads(world, config.global_kv_heads, "num_global_key_value_heads")
    for size in getattr(config, "intermediate_sizes", None) or (config.intermediate_size,):
        if size % world:
            raise ValueError(f"tensor_parallel_size {world} must divide intermediate_size "
                             f"{size}")
