"""The Ray executor on a local Ray cluster (2 CPUs): TP=2 and PP=2 (a tied LM head on the last
stage) with rank 1 as a Ray actor give one rank's greedy tokens, and shutdown ends the actor."""

from __future__ import annotations

import pytest

from compiled_llm import LLM, SamplingParams
from tests.utils import make_checkpoint, random_prompts

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow
BASE = dict(dtype="float32", enforce_eager=True, max_model_len=128, engine_core_process=False,
            kv_cache_memory_bytes=4 << 20)
PARAMS = SamplingParams(temperature=0.0, max_tokens=6)


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
