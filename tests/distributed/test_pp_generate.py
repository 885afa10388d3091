"""Pipeline parallelism over gloo in two processes: greedy tokens and prompt logprobs equal one
rank's for every registered decoder architecture (Llama with three layers, split 2 + 1); each stage
holds only its layers and their KV caches, the pool is the fewest blocks any stage holds, and
a killed stage fails the requests with an error naming it."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from compiled_llm import LLM, SamplingParams
from tests.utils import make_checkpoint, random_prompts

pytestmark = pytest.mark.slow
BUDGET = 4 << 20
BASE = dict(dtype="float32", max_model_len=128, engine_core_process=False, enforce_eager=True,
            kv_cache_memory_bytes=BUDGET)
PARAMS = SamplingParams(temperature=0.0, max_tokens=6, prompt_logprobs=2)


def _run(llm: LLM) -> tuple[list[list[int]], list[list[dict[int, float]]]]:
    prompts = [{"prompt_token_ids": p} for p in random_prompts(3, 300, lo=3, hi=40, seed=5)]
    outs = llm.generate(prompts, PARAMS, use_tqdm=False)
    scores = [[{tok: lp.logprob for tok, lp in row.items()} for row in o.prompt_logprobs[1:]]
              for o in outs]
    return [o.outputs[0].token_ids for o in outs], scores


def _assert_same(got, ref) -> None:
    assert got[0] == ref[0]
    for got_rows, ref_rows in zip(got[1], ref[1], strict=True):
        for got_row, ref_row in zip(got_rows, ref_rows, strict=True):
            assert got_row.keys() == ref_row.keys()
            assert all(abs(got_row[tok] - ref_row[tok]) < 1e-4 for tok in ref_row)


def _reference(ckpt) -> tuple:
    llm = LLM(str(ckpt), **BASE)
    try:
        return _run(llm)
    finally:
        llm.shutdown()


@pytest.fixture(scope="module")
def llama_pp2():
    ckpt = make_checkpoint("llama_3layers")
    llm = LLM(str(ckpt), pipeline_parallel_size=2, **BASE)
    yield ckpt, llm
    llm.shutdown()


def test_llama_pp2_equals_pp1_with_stages_of_their_own_layers(llama_pp2):
    ckpt, llm = llama_pp2
    ref = _reference(ckpt)
    executor = llm.engine.executor
    runner = executor.worker.runner
    stage = runner.model.pipeline_stage  # rank 0 holds the last stage: layer 2 of [2, 1]
    assert (stage.stage, stage.start_layer, stage.end_layer) == (1, 2, 3)
    assert list(runner.model.model.layers.keys()) == ["2"]
    assert runner.model.model.embed_tokens is None  # untied: the head has its own table
    assert len(runner.kv_caches) == 1
    # the pool is stage 0's: two layers' blocks in the same budget
    assert executor.num_blocks == BUDGET // (2 * runner.kv_bytes_per_block())
    _assert_same(_run(llm), ref)
    assert llm.engine.num_used_blocks == 0


def test_killed_stage_fails_requests_with_a_clear_error(llama_pp2):
    _, llm = llama_pp2  # the last use of it: the engine cannot run steps afterwards
    (worker,) = llm.engine.executor.procs
    results = []
    long = SamplingParams(temperature=0.0, max_tokens=110, ignore_eos=True)
    prompts = [{"prompt_token_ids": [5, 6, 7, 8]}, {"prompt_token_ids": [9, 10, 11]}]
    thread = threading.Thread(target=lambda: results.extend(
        llm.generate(prompts, long, use_tqdm=False)))
    thread.start()
    while llm.engine.num_used_blocks == 0 and thread.is_alive():
        time.sleep(0.01)
    os.kill(worker.pid, signal.SIGKILL)  # stage 0, while the stages run steps
    thread.join(30)
    assert not thread.is_alive()  # failed, not hung
    assert len(results) == 2
    for out in results:
        assert out.outputs[0].finish_reason == "error"
        assert "pipeline-parallel worker rank 1" in out.error and "died" in out.error
    assert llm.engine.num_used_blocks == 0
    llm.shutdown()  # this process may join one group at a time: the next test's


# every other registered decoder architecture (llama above); qwen3_moe has 3 layers, sparse
# and dense MLPs mixed, qwen3 ties its LM head to the embedding (both stages hold the table)
@pytest.mark.parametrize("arch", ["qwen3_moe", "mistral", "qwen2", "qwen3", "mixtral",
                                  "qwen2_moe", "starcoder2", "stablelm", "cohere",
                                  "granitemoe", "glm", "glm4", "olmo", "olmoe"])
def test_pp2_equals_pp1(arch):
    ckpt = make_checkpoint(arch)
    ref = _reference(ckpt)
    llm = LLM(str(ckpt), pipeline_parallel_size=2, **BASE)
    try:
        assert llm.engine.executor.tp.pipeline_size == 2
        _assert_same(_run(llm), ref)
        assert llm.engine.num_used_blocks == 0
    finally:
        llm.shutdown()


def test_llama_tp2_pp2_equals_one_rank():
    ckpt = make_checkpoint("llama_3layers")
    ref = _reference(ckpt)
    llm = LLM(str(ckpt), pipeline_parallel_size=2, tensor_parallel_size=2, **BASE)
    try:
        tp = llm.engine.executor.tp  # rank 0: the last stage's first tensor-parallel rank
        assert (tp.global_rank, tp.rank, tp.world_size, tp.pipeline_size) == (0, 0, 2, 2)
        model = llm.engine.executor.worker.runner.model
        attn = model.model.layers["2"].self_attn  # its stage's layer, half its heads
        assert attn.num_heads * 2 == _config_heads(ckpt)
        _assert_same(_run(llm), ref)
        # three requests a step: two micro-batches, each all-reduced within its stage's group
        counts = llm.engine.executor.worker.runner.forward_fn.counts
        assert counts["recv"] == counts["micro_batches"] > counts["steps"]
        assert llm.engine.num_used_blocks == 0
    finally:
        llm.shutdown()


def _config_heads(ckpt) -> int:
    import json

    return json.loads((ckpt / "config.json").read_text())["num_attention_heads"]
