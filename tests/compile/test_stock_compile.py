"""Stock torch.compile: same greedy tokens as eager, and no recompiles as batch sizes vary."""

from __future__ import annotations

import torch

from compiled_llm import LLM, SamplingParams
from tests.utils import make_checkpoint, random_prompts


def test_stock_compile_matches_eager_without_recompiles():
    ckpt = make_checkpoint("qwen3")
    prompts = [{"prompt_token_ids": p} for p in random_prompts(6, 300, lo=2, hi=40, seed=3)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    eager = LLM(str(ckpt), enforce_eager=True, dtype="float32")
    ref = [o.outputs[0].token_ids for o in eager.generate(prompts, params, use_tqdm=False)]

    compiled = LLM(str(ckpt), compile_mode="stock", dtype="float32")  # warm-up compiles here
    frames = dict(torch._dynamo.utils.counters["frames"])
    # batch sizes 1..6 tokens per step and mixed prefill/decode batches
    for k in (1, 2, 6):
        outs = compiled.generate(prompts[:k], params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == ref[:k]
    assert dict(torch._dynamo.utils.counters["frames"]) == frames, "a step recompiled"
    assert compiled.engine.num_used_blocks == 0
