"""Speculative decoding on the GPU, compiled with CUDA graphs: greedy output equals spec off
for n-gram and a draft model, the verify steps (k+1 query tokens per request) replay piecewise
graphs, and the pool is empty after."""

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

GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)


def _tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def ckpt():
    return make_checkpoint("llama")


@pytest.fixture(scope="module")
def prompts():
    return [{"prompt_token_ids": p + p} for p in random_prompts(8, 300, lo=4, hi=40)]


@pytest.fixture(scope="module")
def baseline(ckpt, prompts):
    llm = LLM(str(ckpt), dtype="float32", engine_core_process=False)
    out = _tokens(llm.generate(prompts, GREEDY, use_tqdm=False))
    llm.shutdown()
    return out


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_greedy_equal_under_cuda_graphs(ckpt, prompts, baseline, method):
    spec = {"method": method, "num_speculative_tokens": 3}
    spec.update({"model": str(ckpt)} if method == "draft_model" else
                {"prompt_lookup_max": 3, "prompt_lookup_min": 1})
    llm = LLM(str(ckpt), dtype="float32", speculative_config=spec, engine_core_process=False)
    before = counters.piecewise_steps
    assert _tokens(llm.generate(prompts, GREEDY, use_tqdm=False)) == baseline
    assert counters.piecewise_steps > before  # verify steps replayed piecewise graphs
    stats = llm.engine.scheduler.spec_stats
    assert stats.num_accepted_tokens > 0
    if method == "draft_model":
        assert stats.num_accepted_tokens == stats.num_draft_tokens
    assert llm.engine.num_used_blocks == 0
    llm.shutdown()
