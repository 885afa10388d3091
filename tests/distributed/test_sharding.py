"""The tensor-parallel transform and shard-by-shard loading, in one process (no collective
runs): each rank's parameters are exactly its slices of the checkpoint tensors (a fused
qkv_proj / gate_up_proj's rows part by part), no parameter is full-size where it is sharded,
and one KV head is replicated."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from compiled_llm.distributed.parallel_state import TPGroup
from compiled_llm.distributed.tensor_parallel import check_shardable, head_layout
from compiled_llm.distributed.tp_layers import HeadsParallelRMSNorm
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
