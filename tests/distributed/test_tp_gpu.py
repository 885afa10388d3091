"""Tensor and pipeline parallelism on CUDA: TP=2 over NCCL (one GPU per rank) gives TP=1's
greedy tokens, with the fused all-reduce + RMSNorm on symmetric-memory one-shot all-reduce and
on NCCL alone, with expert parallelism, and for the families that shard themselves; PP=2 (3
layers split 2 + 1) gives PP=1's; both with CUDA graphs captured on every rank (full,
piecewise, both); the mp executor at one rank equals the uniprocess one; two stages on one GPU
are refused."""

from __future__ import annotations

import pytest
import torch

from compiled_llm import LLM, SamplingParams
from compiled_llm.compile.counters import counters
from tests.utils import make_checkpoint, random_prompts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
BASE = dict(dtype="float32", max_model_len=256, engine_core_process=False,
            gpu_memory_utilization=0.3)
PARAMS = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")


def _greedy(**kw) -> list[list[int]]:
    return _greedy_and_graphs(**kw)[0]


def _greedy_and_graphs(**kw) -> tuple[list[list[int]], list[int], int]:
    """Greedy tokens, the driver's full-graph sizes and its full-graph replays."""
    llm = LLM(str(make_checkpoint(kw.pop("arch", "llama"))), **BASE, **kw)
    prompts = [{"prompt_token_ids": p} for p in random_prompts(4, 300, lo=3, hi=60, seed=2)]
    try:
        replays = counters.full_graph_replays
        outs = llm.generate(prompts, PARAMS, use_tqdm=False)
        return ([o.outputs[0].token_ids for o in outs],
                llm.engine.executor.cudagraph_batch_sizes(),
                counters.full_graph_replays - replays)
    finally:
        llm.shutdown()


def test_mp_executor_at_one_rank_equals_uniprocess():
    assert _greedy(distributed_executor_backend="mp") == _greedy()


@two_gpus
@pytest.mark.parametrize("symm_mem", ["1", "0"])
@pytest.mark.parametrize("arch", ["llama", "qwen3_moe"])
def test_tp2_on_two_gpus_equals_tp1(arch, symm_mem, monkeypatch):
    monkeypatch.setenv("COMPILED_LLM_SYMM_MEM_ALLREDUCE", symm_mem)  # the workers inherit it
    assert _greedy(arch=arch, tensor_parallel_size=2) == _greedy(arch=arch)


@two_gpus
@pytest.mark.parametrize("arch", ["gpt_neox", "falcon", "gpt2", "bloom_post_ln", "gemma4",
                                  "gemma3n", "dbrx", "bitnet"])
def test_tp2_fused_attention_and_own_shapes_on_two_gpus_equal_tp1(arch):
    """The families that shard themselves (fused query_key_value / c_attn layouts, per-layer
    head shapes, summed statistics, stacked experts) over NCCL, compiled with CUDA graphs."""
    assert _greedy(arch=arch, tensor_parallel_size=2) == _greedy(arch=arch)


@two_gpus
@pytest.mark.parametrize("arch", ["llama_3layers", "qwen3_moe"])
def test_pp2_on_two_gpus_equals_pp1(arch):
    assert _greedy(arch=arch, pipeline_parallel_size=2) == _greedy(arch=arch)


@two_gpus
@pytest.mark.parametrize("mode", ["full_and_piecewise", "piecewise", "full"])
@pytest.mark.parametrize("parallel", ["tensor_parallel_size", "pipeline_parallel_size"])
def test_cudagraphs_on_two_gpus_equal_one_rank(parallel, mode):
    """Every rank captures the driver's graphs in lockstep (NCCL inside them); decode steps
    replay full graphs (a stage's send and receive outside them), mixed steps piecewise ones
    (two stages: a micro-batch each)."""
    tokens, sizes, replays = _greedy_and_graphs(arch="llama_3layers", cudagraph_mode=mode,
                                                **{parallel: 2})
    assert tokens == _greedy(arch="llama_3layers", cudagraph_mode=mode)
    if "full" in mode:
        assert sizes and replays > 0


def test_two_stages_on_one_gpu_are_refused():
    if torch.cuda.device_count() > 1:
        pytest.skip("more than one GPU is visible")
    with pytest.raises(ValueError, match="pipeline_parallel_size 2 needs 2 GPUs"):
        _greedy(pipeline_parallel_size=2)


@two_gpus
@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen2_moe"])
def test_tp2_expert_parallel_on_two_gpus_equals_tp1(arch):
    # qwen2_moe: the routed experts (local ones only) on the side stream beside the shared one
    assert _greedy(arch=arch, tensor_parallel_size=2, enable_expert_parallel=True) == _greedy(
        arch=arch)
