"""Greedy tokens equal transformers' generate; prompt logprobs close, in float32 (one engine
and one transformers model per checkpoint for both)."""

from __future__ import annotations

import pytest
import torch

from compiled_llm import LLM, SamplingParams
from tests.utils import CONFIGS, hf_greedy, hf_model, make_checkpoint, random_prompts

NEW_TOKENS = 32


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_greedy_and_prompt_logprobs_match_transformers(name):
    checkpoint = make_checkpoint(name)
    llm = LLM(str(checkpoint), enforce_eager=True, dtype="float32")
    vocab = llm.engine.model_config.vocab_size
    prompts = random_prompts(8, vocab, hi=70)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == hf_greedy(checkpoint, prompts, NEW_TOKENS)
    prompts = random_prompts(4, vocab, seed=1)
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert llm.engine.num_used_blocks == 0
    llm.shutdown()
    hf = hf_model(checkpoint)
    for p, out in zip(prompts, outs, strict=True):
        with torch.no_grad():
            ref = hf(torch.tensor([p])).logits[0].float().log_softmax(-1)
        expected = ref[torch.arange(len(p) - 1), torch.tensor(p[1:])]
        assert out.prompt_logprobs[0] is None
        got = torch.tensor([d[t].logprob for d, t in zip(out.prompt_logprobs[1:], p[1:])])
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
