"""Tensor parallelism over gloo in two processes: greedy tokens equal one rank's on every
registered decoder architecture (with one KV head, replicated; with an odd vocabulary, padded
on the last rank), and the all-reduce + RMSNorm pass fuses every norm site of the compiled
TP graph."""

from __future__ import annotations

import pytest
import torch

from compiled_llm import LLM, SamplingParams
from compiled_llm.compile.counters import counters
from tests.utils import make_checkpoint, random_prompts

pytestmark = pytest.mark.slow
BASE = dict(dtype="float32", max_model_len=128, engine_core_process=False,
            kv_cache_memory_bytes=4 << 20)
PARAMS = SamplingParams(temperature=0.0, max_tokens=6)
# one tiny checkpoint per registered decoder architecture, plus a one-KV-head GQA model
ARCHS = ["llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "qwen2_moe", "phi3",
         "gemma", "gemma2", "gemma3", "olmo2", "cohere", "cohere_plain", "stablelm_serial",
         "granite", "smollm3", "glm", "glm4", "olmo", "olmo3", "llama_odd_vocab",
         "granite_odd_vocab",  # (the odd vocabularies: the last rank's rows padded)
         "starcoder2", "apertus", "jais2",  # ungated MLPs (c_fc / c_proj; up_proj / down_proj)
         # the classic decoders: per-head fused query_key_value ([H, 3, D]: ALiBi slopes per
         # rank on Bloom), q | k | v stacks (MPT's Wqkv, GPT-2's Conv1D c_attn), Falcon's and
         # GPTBigCode's multi-query (K/V replicated) and grouped layouts, other output names
         "gpt_neox", "persimmon", "bloom_post_ln", "mpt", "gpt2", "falcon", "falcon_new_arch",
         "falcon_alibi", "opt", "gptj", "phi", "nanochat", "gpt_neo", "gpt_bigcode",
         "gpt_bigcode_mha"]
LAYERS = 2  # tests/utils.py SMALL


def _prompts():
    return [{"prompt_token_ids": p} for p in random_prompts(3, 300, lo=3, hi=40, seed=5)]


def _greedy(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(_prompts(), PARAMS, use_tqdm=False)]


def _reference(ckpt) -> list[list[int]]:
    llm = LLM(str(ckpt), enforce_eager=True, **BASE)
    try:
        return _greedy(llm)
    finally:
        llm.shutdown()


@pytest.mark.parametrize("arch", ARCHS)
def test_tp2_greedy_equals_tp1(arch):
    ckpt = make_checkpoint(arch)
    ref = _reference(ckpt)
    llm = LLM(str(ckpt), enforce_eager=True, tensor_parallel_size=2, **BASE)
    try:
        assert llm.engine.executor.tp.world_size == 2
        assert _greedy(llm) == ref
        assert llm.engine.num_used_blocks == 0
    finally:
        llm.shutdown()


def test_tp2_compiled_one_kv_head_fuses_allreduce_rms_norm(monkeypatch):
    """GQA with 1 KV head over 2 ranks (replicated); compiled under the backend, every
    residual norm site reads an all-reduce and the pass fuses each (the passes must run: no
    cache of ours or Inductor's)."""
    ckpt = make_checkpoint("llama_kv1")
    ref = _reference(ckpt)
    counters.reset()
    monkeypatch.setenv("COMPILED_LLM_DISABLE_CACHE", "1")  # the follower inherits both
    with torch._inductor.config.patch(fx_graph_cache=False):
        llm = LLM(str(ckpt), tensor_parallel_size=2, compile_mode="backend", **BASE)
    try:
        runner = llm.engine.executor.worker.runner
        assert runner.model.config.num_key_value_heads == 1  # this rank's (replicated) head
        assert _greedy(llm) == ref
        # post-attention norms and the next layer's (or the final) norm: o_proj and down_proj
        assert counters.pass_matches["AllReduceRMSNormFusionPass"] == 2 * LAYERS
        assert counters.graph_breaks == 0
    finally:
        llm.shutdown()


def test_tp2_fp8_kv_cache_calibrates_every_rank():
    """FP8 KV scales the checkpoint lacks are calibrated on the first real step by every rank
    for its own heads, so TP=2 gives TP=1's tokens and prompt logprobs."""
    ckpt = make_checkpoint("llama")
    params = SamplingParams(temperature=0.0, max_tokens=6, prompt_logprobs=1)
    runs = []
    for tp in (1, 2):
        llm = LLM(str(ckpt), enforce_eager=True, tensor_parallel_size=tp,
                  kv_cache_dtype="fp8", **BASE)
        try:
            runs.append(llm.generate(_prompts(), params, use_tqdm=False))
        finally:
            llm.shutdown()
    for one, two in zip(*runs):
        assert one.outputs[0].token_ids == two.outputs[0].token_ids
        for a, b in zip(one.prompt_logprobs[1:], two.prompt_logprobs[1:]):
            token = next(iter(a))
            assert a[token].logprob == pytest.approx(b[token].logprob, abs=1e-3)
