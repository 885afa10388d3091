"""The Ray executor on a local Ray cluster (2 CPUs): TP=2 and PP=2 (a tied LM head on the last
stage) with rank 1 as a Ray actor give one rank's greedy tokens, and shutdown ends the actor;
a local Ray instance the engine started itself is shut down with the engine."""

from __future__ import annotations

import time

import psutil
import pytest

from compiled_llm import LLM, SamplingParams
from tests.utils import make_checkpoint, random_prompts

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow
BASE = dict(dtype="float32", enforce_eager=True, max_model_len=128, engine_core_process=False,
            kv_cache_memory_bytes=4 << 20)
PARAMS = SamplingParams(temperature=0.0, max_tokens=6)


def test_local_ray_started_by_the_engine_ends_with_it():
    """Runs before the module's cluster fixture: no Ray is connected, so the engine starts
    one; after shutdown none of its processes (raylet, GCS, dashboard, workers) is left."""
    assert not ray.is_initialized()
    before = set(psutil.Process().children(recursive=True))  # other tests' (compile workers)
    llm = LLM(str(make_checkpoint("llama")), distributed_executor_backend="ray",
              tensor_parallel_size=2, **BASE)
    try:
        assert ray.is_initialized()
        out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], PARAMS, use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == PARAMS.max_tokens
    finally:
        llm.shutdown()
    assert not ray.is_initialized()
    deadline = time.monotonic() + 30
    while (left := set(psutil.Process().children(recursive=True)) - before) and \
            time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.parametrize("field", ["tensor_parallel_size", "pipeline_parallel_size"])
def test_ray_two_ranks_greedy_equals_one(cluster, field):
    ckpt = str(make_checkpoint("qwen3"))
    prompts = [{"prompt_token_ids": p} for p in random_prompts(3, 300, seed=4)]
    one = LLM(ckpt, **BASE)
    ref = [o.outputs[0].token_ids for o in one.generate(prompts, PARAMS, use_tqdm=False)]
    one.shutdown()
    llm = LLM(ckpt, distributed_executor_backend="ray", **{field: 2}, **BASE)
    try:
        (actor,) = llm.engine.executor.procs
        assert actor.exitcode is None and actor.pid is not None
        assert [o.outputs[0].token_ids
                for o in llm.generate(prompts, PARAMS, use_tqdm=False)] == ref
        assert llm.engine.num_used_blocks == 0
    finally:
        llm.shutdown()
    assert actor.exitcode == 0  # it left its loop on the stop message
