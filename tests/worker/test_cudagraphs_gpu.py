"""CUDA graphs (GPU only): whole-model decode graphs and piecewise graphs give the same
greedy tokens as eager, are actually replayed, and nothing recompiles."""

from __future__ import annotations

import pytest
import torch

from compiled_llm import LLM, SamplingParams
from compiled_llm.compile import counters
from tests.utils import make_checkpoint, random_prompts

IN_PROCESS = {"engine_core_process": False}  # these tests reach inside the engine

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("mode", ["full_and_piecewise", "piecewise", "full"])
def test_cudagraphs_match_eager(mode, tmp_path):
    ckpt = make_checkpoint("qwen3_deep")
    prompts = [{"prompt_token_ids": p} for p in random_prompts(11, 300, lo=2, hi=90, seed=9)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    eager = LLM(str(ckpt), **IN_PROCESS, enforce_eager=True, dtype="float32",
                attention_backend="torch", gpu_memory_utilization=0.4)
    ref = [o.outputs[0].token_ids for o in eager.generate(prompts, params, use_tqdm=False)]
    counters.reset()
    llm = LLM(str(ckpt), **IN_PROCESS, dtype="float32", cudagraph_mode=mode, max_num_seqs=16,
              gpu_memory_utilization=0.4,
              compile_cache_dir=str(tmp_path))
    for k in (1, 3, 11):  # decode batches of 1, 3 and 11 sequences, mixed batches before
        outs = llm.generate(prompts[:k], params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == ref[:k]
    assert counters.graphs_captured == 1 and counters.recompiles == 0
    if mode != "piecewise":
        assert counters.full_graph_replays > 0
    if mode != "full":
        assert counters.piecewise_steps > 0
    assert llm.engine.num_used_blocks == 0


def test_async_scheduling_with_cudagraphs(tmp_path):
    """Async scheduling fills pending input ids on the device before the graphs replay: the
    tokens match step-by-step execution, through chunked prefill and decode graphs."""
    ckpt = make_checkpoint("qwen3_deep")
    prompts = [{"prompt_token_ids": p} for p in random_prompts(11, 300, lo=2, hi=90, seed=9)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    kw = dict(dtype="float32", max_num_seqs=16, gpu_memory_utilization=0.4,
              max_num_batched_tokens=64, compile_cache_dir=str(tmp_path))
    ref = LLM(str(ckpt), **IN_PROCESS, **kw).generate(prompts, params, use_tqdm=False)
    counters.reset()
    llm = LLM(str(ckpt), **IN_PROCESS, async_scheduling=True, **kw)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in ref]
    assert counters.full_graph_replays > 0 and counters.piecewise_steps > 0
    assert llm.engine.num_used_blocks == 0


def test_two_engines_each_own_their_graph_pool(tmp_path):
    """Engines in one process capture into their own pools: both replay correctly at once,
    and one made after another was deleted captures and replays too."""
    ckpt = make_checkpoint("qwen3_deep")
    prompts = [{"prompt_token_ids": p} for p in random_prompts(5, 300, lo=2, hi=40, seed=3)]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    kw = dict(dtype="float32", max_num_seqs=8, gpu_memory_utilization=0.3,
              compile_cache_dir=str(tmp_path))
    first, second = LLM(str(ckpt), **IN_PROCESS, **kw), LLM(str(ckpt), **IN_PROCESS, **kw)
    pools = {llm.engine.executor.worker.runner.graph_pool for llm in (first, second)}
    assert len(pools) == 2
    ref = [o.outputs[0].token_ids for o in first.generate(prompts, params, use_tqdm=False)]
    assert [o.outputs[0].token_ids for o in second.generate(prompts, params,
                                                            use_tqdm=False)] == ref
    del first, second
    third = LLM(str(ckpt), **IN_PROCESS, **kw)
    assert [o.outputs[0].token_ids for o in third.generate(prompts, params,
                                                           use_tqdm=False)] == ref
