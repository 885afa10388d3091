"""Expert parallelism (enable_expert_parallel): each rank loads whole experts (its contiguous
range, renumbered locally) and the replicated router, the dispatcher maps global ids to local
ones, misconfigurations are ValueErrors naming the field, and over gloo two ranks with expert
parallelism give one rank's greedy tokens (Qwen2-MoE: routed experts plus a sharded shared
expert and dense layers)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import load_file

from compiled_llm import LLM
from compiled_llm.config import EngineArgs
from compiled_llm.distributed.expert_parallel import AllReduceDispatcher, ExpertParallelMoE
from compiled_llm.distributed.parallel_state import TPGroup
from compiled_llm.distributed.tensor_parallel import check_shardable
from compiled_llm.worker.loader import build_model_config, load_hf_config, load_model
from tests.distributed.test_tp_generate import BASE, _greedy, _reference
from tests.utils import make_checkpoint

NUM_EXPERTS = 8  # tests/utils.py qwen2_moe


def test_rank_holds_its_whole_experts_and_the_router():
    ckpt = make_checkpoint("qwen2_moe")
    model = load_model(ckpt, torch.float32, torch.device("cpu"), 128,
                       tp=TPGroup(1, 2, "unused", None, None), expert_parallel=True)
    full = load_file(ckpt / "model.safetensors")
    layer = "model.layers.1.mlp"  # decoder_sparse_step 2: layer 1 is sparse
    block = model.model.layers[1].mlp
    experts = block.experts
    assert isinstance(experts, ExpertParallelMoE) and experts.num_experts == 4
    for local in range(4):
        prefix = f"{layer}.experts.{4 + local}"  # rank 1 holds experts 4..7
        gate, up = experts.w13_weight[local].chunk(2)
        assert torch.equal(gate, full[f"{prefix}.gate_proj.weight"])
        assert torch.equal(up, full[f"{prefix}.up_proj.weight"])
        assert torch.equal(experts.w2_weight[local], full[f"{prefix}.down_proj.weight"])
    assert torch.equal(block.gate.weight, full[f"{layer}.gate.weight"])  # replicated
    shared_rows = block.shared_expert.gate_up_proj_weight.shape[0] // 2  # sliced, as in TP
    assert shared_rows == 48 // 2


def test_dispatch_maps_other_ranks_experts_to_the_skip_id():
    ids = torch.tensor([[0, 5], [7, 4], [3, 6]])
    dispatched = AllReduceDispatcher(4, 4).dispatch(torch.zeros(3, 2), torch.ones(3, 2), ids)
    assert dispatched.topk_ids.tolist() == [[4, 1], [3, 0], [4, 2]]


def test_local_experts_trace_fullgraph_and_equal_the_full_layer_in_sum():
    from compiled_llm.distributed.expert_parallel import shard_experts
    from compiled_llm.models.moe import FusedMoE
    from tests.moe.helpers import moe_inputs

    x, w13, w2, weights, ids = moe_inputs(5, 4, 2, 16, 8)
    full = FusedMoE(4, 16, 8)
    full.w13_weight.data, full.w2_weight.data = w13, w2
    total = torch.zeros_like(x)
    for rank in range(2):
        part = FusedMoE(4, 16, 8)
        shard_experts(part, rank, 2)
        part.w13_weight = torch.nn.Parameter(w13[2 * rank:2 * rank + 2], requires_grad=False)
        part.w2_weight = torch.nn.Parameter(w2[2 * rank:2 * rank + 2], requires_grad=False)
        total += torch.compile(part, backend="eager", fullgraph=True)(x, weights, ids)
    torch.testing.assert_close(total, full(x, weights, ids), atol=1e-5, rtol=1e-5)


def test_misconfigurations_name_the_field():
    with pytest.raises(ValueError, match="enable_expert_parallel needs tensor_parallel_size"):
        EngineArgs(model="unused", enable_expert_parallel=True)
    with pytest.raises(ValueError, match="enable_expert_parallel must be a bool"):
        EngineArgs(model="unused", enable_expert_parallel="yes", tensor_parallel_size=2)
    moe = build_model_config(load_hf_config(make_checkpoint("qwen2_moe")))[1]
    with pytest.raises(ValueError, match="enable_expert_parallel: tensor_parallel_size 3 must "
                                         "divide num_experts 8"):
        check_shardable(moe, 3, expert_parallel=True)
    dense = build_model_config(load_hf_config(make_checkpoint("llama")))[1]
    with pytest.raises(ValueError, match="enable_expert_parallel: the model has no mixture"):
        check_shardable(dense, 2, expert_parallel=True)



def test_dense_intermediate_size_is_checked_only_where_a_layer_is_dense():
    """Mixtral's intermediate_size is its experts' size: whole per rank under expert
    parallelism, so an odd one splits; an all-sparse Qwen3-MoE never reads intermediate_size."""
    mixtral = build_model_config(load_hf_config(make_checkpoint("mixtral")))[1]
    odd = dataclasses.replace(mixtral, intermediate_size=25,
                              moe=dataclasses.replace(mixtral.moe, moe_intermediate_size=25))
    check_shardable(odd, 2, expert_parallel=True)
    with pytest.raises(ValueError, match="tensor_parallel_size 2 must divide "
                                         "moe_intermediate_size 25"):
        check_shardable(odd, 2)
    qwen3 = build_model_config(load_hf_config(make_checkpoint("qwen3_moe")))[1]
    sparse = dataclasses.replace(qwen3, intermediate_size=25,
                                 moe=dataclasses.replace(qwen3.moe, mlp_only_layers=()))
    check_shardable(sparse, 2)
    with pytest.raises(ValueError, match="tensor_parallel_size 2 must divide intermediate_size"):
        check_shardable(dataclasses.replace(sparse, moe=qwen3.moe), 2)  # layer 1 is dense

@pytest.mark.slow
def test_tp2_expert_parallel_greedy_equals_tp1():
    ckpt = make_checkpoint("qwen2_moe")
    ref = _reference(ckpt)
    llm = LLM(str(ckpt), enforce_eager=True, tensor_parallel_size=2,
              enable_expert_parallel=True, **BASE)
    try:
        runner = llm.engine.executor.worker.runner
        assert runner.model.model.layers[1].mlp.experts.num_experts == NUM_EXPERTS // 2
        assert _greedy(llm) == ref
        assert llm.engine.num_used_blocks == 0
    finally:
        llm.shutdown()


def test_cli_flag_comes_from_the_field():
    import argparse

    from compiled_llm.entrypoints.cli.args import add_engine_args, engine_args

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    for flag in ("--enable-expert-parallel", "-ep"):
        args = engine_args(parser.parse_args(["--model", "unused", "-tp", "2", flag]))
        assert args.enable_expert_parallel is True
