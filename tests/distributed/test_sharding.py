"""The tensor-parallel transform and shard-by-shard loading, in one process (no collective
runs): each rank's parameters are exactly its slices of the checkpoint tensors (a fused
qkv_proj / gate_up_proj's rows part by part; a per-head query_key_value's heads; GPT-2's
Conv1D columns), no parameter is full-size where it is sharded, and one KV head is replicated."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from compiled_llm.distributed.parallel_state import TPGroup
from compiled_llm.distributed.tensor_parallel import check_shardable, head_layout
from compiled_llm.distributed.tp_layers import HeadsParallelRMSNorm
from compiled_llm.models.alibi import bloom_alibi_slopes
from compiled_llm.worker.loader import build_model_config, load_hf_config, load_model
from tests.utils import make_checkpoint


def _rank(rank: int, world: int = 2) -> TPGroup:
    return TPGroup(rank, world, "unused", None, None)  # loading runs no collective


def _load(name: str, rank: int):
    ckpt = make_checkpoint(name)
    model = load_model(ckpt, torch.float32, torch.device("cpu"), 128, tp=_rank(rank))
    full = {}
    for path in ckpt.glob("*.safetensors"):
        full.update(load_file(path))
    return model, full


@pytest.mark.parametrize("rank", [0, 1])
def test_llama_rank_holds_its_slices(rank):
    model, full = _load("llama", rank)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    q_rows = 2 * 16  # 2 of 4 query heads of head_dim 16 (hidden 64)
    kv_rows = 1 * 16  # 1 of 2 KV heads
    layer = "model.layers.0"
    assert torch.equal(attn.q_proj.weight,
                       full[f"{layer}.self_attn.q_proj.weight"][rank * q_rows:(rank + 1) * q_rows])
    assert torch.equal(attn.k_proj.weight, full[f"{layer}.self_attn.k_proj.weight"][
        rank * kv_rows:(rank + 1) * kv_rows])
    assert torch.equal(attn.o_proj.weight, full[f"{layer}.self_attn.o_proj.weight"][
        :, rank * q_rows:(rank + 1) * q_rows])
    assert torch.equal(mlp.down_proj.weight,
                       full[f"{layer}.mlp.down_proj.weight"][:, rank * 64:(rank + 1) * 64])
    vocab = full["model.embed_tokens.weight"].shape[0] // 2
    assert torch.equal(model.model.embed_tokens.weight,
                       full["model.embed_tokens.weight"][rank * vocab:(rank + 1) * vocab])
    assert (attn.num_heads, attn.num_kv_heads) == (2, 1)
    assert model.config.num_key_value_heads == 1  # sizes this rank's KV cache
    assert model.config.tensor_parallel == f"rank {rank} of 2"  # in the compile cache key


@pytest.mark.parametrize("name", ["arcee", "nemotron", "jais2", "apertus", "starcoder2"])
def test_ungated_mlp_rank_holds_its_up_rows_and_down_columns(name):
    """An ungated MLP (up, act, down under its checkpoint's names): up's rows and bias by
    this rank's half, down's columns; down's bias whole (added once, after the all-reduce)."""
    for rank in (0, 1):
        model, full = _load(name, rank)
        mlp = model.model.layers[1].mlp
        up, down = getattr(mlp, mlp.up_name), getattr(mlp, mlp.down_name)
        prefix, rows = "model.layers.1.mlp", up.out_features
        assert rows * 2 == full[f"{prefix}.{mlp.up_name}.weight"].shape[0]
        part = slice(rank * rows, (rank + 1) * rows)
        assert torch.equal(up.weight, full[f"{prefix}.{mlp.up_name}.weight"][part])
        assert torch.equal(down.weight, full[f"{prefix}.{mlp.down_name}.weight"][:, part])
        if up.bias is not None:
            assert torch.equal(up.bias, full[f"{prefix}.{mlp.up_name}.bias"][part])
            assert torch.equal(down.bias, full[f"{prefix}.{mlp.down_name}.bias"])
        assert type(down).__name__ == "RowParallelLinear"


def test_one_kv_head_is_replicated_on_every_rank():
    (zero, full), (one, _) = _load("llama_kv1", 0), _load("llama_kv1", 1)
    k_full = full["model.layers.1.self_attn.k_proj.weight"]
    for model in (zero, one):
        assert torch.equal(model.model.layers[1].self_attn.k_proj.weight, k_full)


def test_moe_experts_hold_their_intermediate_rows():
    model, full = _load("qwen3_moe", 1)
    experts = model.model.layers[0].mlp.experts
    size = 32 // 2  # moe_intermediate_size over 2 ranks
    prefix = "model.layers.0.mlp.experts.3"
    gate, up = experts.w13_weight[3].chunk(2)
    assert torch.equal(gate, full[f"{prefix}.gate_proj.weight"][size:])
    assert torch.equal(up, full[f"{prefix}.up_proj.weight"][size:])
    assert torch.equal(experts.w2_weight[3], full[f"{prefix}.down_proj.weight"][:, size:])


def _rows(full: torch.Tensor, size: int, rank: int) -> torch.Tensor:
    return full[rank * size:(rank + 1) * size]


@pytest.mark.parametrize("rank", [0, 1])
def test_fused_qkv_and_gate_up_take_each_parts_rows(rank):
    """Phi-3's qkv_proj: this rank's q rows, then its k rows, then its v rows (not a contiguous
    slice of the fused weight); gate_up_proj: its gate rows, then its up rows."""
    model, full = _load("phi3", rank)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    layer = "model.layers.0"
    q, k, v = full[f"{layer}.self_attn.qkv_proj.weight"].split([64, 32, 32])  # 4 and 2 heads
    assert torch.equal(attn.qkv_proj.weight, torch.cat([_rows(q, 32, rank), _rows(k, 16, rank),
                                                        _rows(v, 16, rank)]))
    assert (attn.num_heads, attn.num_kv_heads, attn.q_size, attn.kv_size) == (2, 1, 32, 16)
    gate, up = full[f"{layer}.mlp.gate_up_proj.weight"].chunk(2)  # intermediate 128
    assert torch.equal(mlp.gate_up_proj.weight,
                       torch.cat([_rows(gate, 64, rank), _rows(up, 64, rank)]))
    assert torch.equal(mlp.down_proj.weight,
                       full[f"{layer}.mlp.down_proj.weight"][:, rank * 64:(rank + 1) * 64])


def test_norms_over_the_whole_projection_are_sharded_and_reduced():
    """OLMo 2's q_norm / k_norm span every head: each rank keeps its heads' columns of the
    weight and averages the mean square over the group; Qwen3's per-head norms stay whole."""
    model, full = _load("olmo2", 1)
    attn = model.model.layers[0].self_attn
    prefix = "model.layers.0.self_attn"
    assert torch.equal(attn.q_norm.weight, full[f"{prefix}.q_norm.weight"][32:])
    assert torch.equal(attn.k_norm.weight, full[f"{prefix}.k_norm.weight"][16:])
    assert type(attn.q_norm) is HeadsParallelRMSNorm and attn.q_norm.world_size == 2
    qwen3, _ = _load("qwen3", 1)
    assert type(qwen3.model.layers[0].self_attn.q_norm) is not HeadsParallelRMSNorm


def test_head_layout_and_refusals():
    assert head_layout(8, 2, 3, 4).first_kv_head == 1  # ranks 2, 3 read KV head 1
    with pytest.raises(ValueError, match="tensor_parallel_size 3 must divide num_attention"):
        head_layout(4, 2, 0, 3)
    config = build_model_config(load_hf_config(make_checkpoint("llama")))[1]
    with pytest.raises(ValueError, match="tensor_parallel_size 8 must divide"):
        check_shardable(config, 8)


@pytest.mark.parametrize("rank", [0, 1])
def test_classic_fused_query_key_value_keeps_its_heads_rows(rank):
    """GPT-NeoX's query_key_value ([H, 3, D] rows): this rank's heads' q, k and v rows (one
    run), dense's columns; Falcon's multi-query [q..., k, v]: its q heads' rows, the one k and
    v replicated; GPT-2's Conv1D c_attn ([in, 3 * hidden]): its heads' columns of each third;
    Bloom: its heads' ALiBi slopes."""
    model, full = _load("gpt_neox", rank)
    attn, heads = model.gpt_neox.layers[0].attention, slice(2 * rank, 2 * rank + 2)
    prefix = "gpt_neox.layers.0.attention"
    qkv = full[f"{prefix}.query_key_value.weight"].view(4, 3 * 16, 64)  # 4 heads of 16
    assert torch.equal(attn.query_key_value.weight, qkv[heads].flatten(0, 1))
    assert torch.equal(attn.dense.weight, full[f"{prefix}.dense.weight"][:, _cols(rank)])
    assert attn.num_heads == 2
    model, full = _load("falcon", rank)
    qkv = full["transformer.h.0.self_attention.query_key_value.weight"]  # [(4 + 2) * 16, 64]
    assert torch.equal(model.transformer.h[0].self_attention.query_key_value.weight,
                       torch.cat([qkv[_cols(rank)], qkv[64:]]))
    model, full = _load("gpt2", rank)
    c_attn = full["transformer.h.0.attn.c_attn.weight"]  # Conv1D [64, 3 * 64]
    assert torch.equal(model.transformer.h[0].attn.c_attn.weight, torch.cat(
        [third[:, _cols(rank)] for third in c_attn.split(64, 1)], 1).t())
    model, _ = _load("bloom_post_ln", rank)
    assert torch.equal(model.transformer.h[0].self_attention.alibi_slopes,
                       bloom_alibi_slopes(12)[6 * rank:6 * rank + 6])


def _cols(rank: int) -> slice:
    return slice(32 * rank, 32 * rank + 32)  # 2 of 4 heads of 16


def test_falcon_kv_group_over_two_ranks_is_replicated():
    """Falcon-40B's layout, 2 KV groups [q, q, k, v] over 4 ranks: each rank holds its q head
    and its group's k and v."""
    ckpt = make_checkpoint("falcon_new_arch")
    qkv = load_file(next(ckpt.glob("*.safetensors")))[
        "transformer.h.1.self_attention.query_key_value.weight"].view(2, 4, 16, 64)
    for rank in range(4):
        model = load_model(ckpt, torch.float32, torch.device("cpu"), 128, tp=_rank(rank, 4))
        attn = model.transformer.h[1].self_attention
        group = qkv[rank // 2]  # [q, q, k, v] rows of 16
        assert torch.equal(attn.query_key_value.weight, group[[rank % 2, 2, 3]].flatten(0, 1))
        assert (attn.num_heads, attn.num_kv_heads) == (1, 1)
