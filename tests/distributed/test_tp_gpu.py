"""Tensor parallelism on CUDA: TP=2 over NCCL (one GPU per rank) gives TP=1's greedy tokens,
with the fused all-reduce + RMSNorm on torch's symmetric-memory one-shot all-reduce and on
NCCL alone; the mp executor at one rank equals the uniprocess one."""

from __future__ import annotations

import pytest
import torch

from compiled_llm import LLM, SamplingParams
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
    llm = LLM(str(make_checkpoint(kw.pop("arch", "llama"))), **BASE, **kw)
    prompts = [{"prompt_token_ids": p} for p in random_prompts(4, 300, lo=3, hi=60, seed=2)]
    try:
        return [o.outputs[0].token_ids for o in llm.generate(prompts, PARAMS, use_tqdm=False)]
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
