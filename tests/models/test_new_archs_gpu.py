"""Gemma 3, Phi-3, Granite, SmolLM3 and OLMo 2 on CUDA (GPU only): the compiled model with
CUDA graphs and the Triton attention kernels (head_dim 16 and Gemma 3's 256, sliding and full
layers, a partial rotary factor, Granite's scalars, SmolLM3's NoPE layers, OLMo 2's post-norms)
gives transformers' greedy tokens, in float32."""

from __future__ import annotations

import pytest
import torch

from compiled_llm import LLM, SamplingParams
from tests.utils import hf_greedy, make_checkpoint, random_prompts

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("name", ["gemma3", "gemma3_d256", "phi3", "phi3_longrope_partial",
                                  "granite", "smollm3", "olmo2"])
def test_compiled_with_cuda_graphs_matches_transformers(name, tmp_path):
    ckpt = make_checkpoint(name)
    # within 32 positions: LongRoPE's original length (transformers recomputes past it)
    prompts = random_prompts(5, 300, lo=3, hi=16, seed=6)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    llm = LLM(str(ckpt), dtype="float32", gpu_memory_utilization=0.3, max_num_seqs=8,
              compile_cache_dir=str(tmp_path))
    for k in (1, 5):  # decode batches of 1 and 5 sequences
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts[:k]], params,
                            use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == hf_greedy(ckpt, prompts[:k], 12)
    llm.shutdown()
