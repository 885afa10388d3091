"""Pipeline stages in one process (no send or recv runs): vLLM's layer split and its
VLLM_PP_LAYER_PARTITION override, each rank's stage holding exactly its layers' checkpoint
tensors (and its ends), and settings that cannot run refused as the args are made."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from compiled_llm.config import EngineArgs
from compiled_llm.distributed.parallel_state import TPGroup
from compiled_llm.distributed.pipeline_parallel import ENV_PARTITION, layer_partition, rank_stage
from compiled_llm.worker.loader import load_model
from tests.utils import make_checkpoint


@pytest.mark.parametrize(("layers", "stages", "parts"), [
    (3, 2, [2, 1]), (8, 4, [2, 2, 2, 2]), (10, 4, [2, 3, 3, 2]), (5, 3, [2, 2, 1]),
])
def test_layer_partition_follows_vllm(layers, stages, parts):
    assert layer_partition(layers, stages) == parts


def test_partition_env_var_overrides_and_is_checked(monkeypatch):
    monkeypatch.setenv(ENV_PARTITION, "1,2")
    assert layer_partition(3, 2) == [1, 2]
    assert rank_stage(0, 2, 3).start_layer == 1  # rank 0 holds the last stage
    for bad in ("1,1", "3,0", "a,b", "1,1,1"):
        monkeypatch.setenv(ENV_PARTITION, bad)
        with pytest.raises(ValueError, match=ENV_PARTITION):
            layer_partition(3, 2)


def test_more_stages_than_layers_is_refused():
    with pytest.raises(ValueError, match="pipeline_parallel_size 3 exceeds"):
        layer_partition(2, 3)


def _stage(name: str, rank: int, tp_rank: int = 0, tp_size: int = 1):
    ckpt = make_checkpoint(name)
    group = TPGroup(tp_rank, tp_size, "unused", None, None, global_rank=rank * tp_size + tp_rank,
                    pipeline_rank=rank, pipeline_size=2)  # loading runs no collective
    model = load_model(ckpt, torch.float32, torch.device("cpu"), 128, tp=group,
                       pipeline_parallel_size=2)
    full = {}
    for path in ckpt.glob("*.safetensors"):
        full.update(load_file(path))
    return model, full


def test_first_stage_holds_the_embedding_and_its_layers_only():
    model, full = _stage("llama_3layers", rank=1)
    body = model.model
    assert list(body.layers.keys()) == ["0", "1"]
    assert body.norm is None and model.lm_head is None
    assert model.config.num_hidden_layers == 2  # KV caches for its two layers
    assert [layer.self_attn.layer_idx for layer in body.layers.values()] == [0, 1]
    assert torch.equal(body.embed_tokens.weight, full["model.embed_tokens.weight"])
    ours = dict(model.named_parameters())
    assert not any(name.startswith("model.layers.2.") for name in ours)
    name = "model.layers.1.mlp.down_proj.weight"
    assert torch.equal(ours[name], full[name])


def test_last_stage_holds_its_layer_norm_and_head():
    model, full = _stage("llama_3layers", rank=0)
    body = model.model
    assert list(body.layers.keys()) == ["2"] and body.embed_tokens is None
    assert body.layers["2"].self_attn.layer_idx == 0
    assert torch.equal(model.lm_head.weight, full["lm_head.weight"])
    assert torch.equal(body.norm.weight, full["model.norm.weight"])


def test_tied_head_on_the_last_stage_reads_the_embedding_table():
    model, full = _stage("qwen3", rank=0)  # tie_word_embeddings
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(model.lm_head.weight, full["model.embed_tokens.weight"])


def test_a_stage_of_two_tensor_parallel_ranks_holds_its_shard_of_its_layers():
    model, full = _stage("llama_3layers", rank=1, tp_rank=1, tp_size=2)  # stage 0, TP rank 1
    body = model.model
    assert list(body.layers.keys()) == ["0", "1"] and model.lm_head is None
    stage = model.pipeline_stage
    assert (stage.next_rank, stage.prev_rank) == (1, -1)  # stage 1's TP rank 1: global 0 * 2 + 1
    q_full = full["model.layers.1.self_attn.q_proj.weight"]
    half = q_full.shape[0] // 2
    assert torch.equal(body.layers["1"].self_attn.q_proj.weight, q_full[half:])
    vocab = full["model.embed_tokens.weight"]
    assert torch.equal(body.embed_tokens.weight, vocab[vocab.shape[0] // 2:])
    assert "stage 0 of 2" in model.config.pipeline_parallel
    assert model.config.tensor_parallel == "rank 1 of 2"


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(pipeline_parallel_size=2, distributed_executor_backend="uni"),
     "pipeline_parallel_size 2 needs"),
    (dict(pipeline_parallel_size=2, enable_lora=True), "pipeline_parallel_size 2 with"),
    (dict(pipeline_parallel_size=True), "pipeline_parallel_size must be an int"),
    (dict(pipeline_parallel_size=2, kv_cache_dtype="fp8"), "with kv_cache_dtype 'fp8'"),
])
def test_settings_that_cannot_run_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineArgs(**kwargs)

