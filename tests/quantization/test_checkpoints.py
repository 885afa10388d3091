"""Quantized checkpoints detected from config.json, against transformers running the same
model with the dequantized weights in float32: greedy tokens equal for the weight-only formats,
prompt logprobs close for every format (W8A8 formats quantize activations too)."""

from __future__ import annotations

import pytest
import torch

from compiled_llm import LLM, SamplingParams
from tests.quantization.packers import packed_pair
from tests.utils import hf_greedy, random_prompts

WEIGHT_ONLY = ("gptq", "gptq_act_order", "awq", "ct_W4A16")
W8A8 = ("fp8_block", "ct_FP8_DYNAMIC", "ct_FP8", "ct_W8A8")
# asymmetric and per-channel int4, GPTQ's v2 zeros, compressed-tensors' activation order and
# 128x128 FP8 blocks: refused before, read as their publishers write them now
MORE_WEIGHT_ONLY = ("gptq_asym", "gptq_asym_v2", "gptq_channel", "ct_W4A16_ASYM",
                    "ct_W4A16_CHANNEL", "ct_act_order")
MORE_W8A8 = ("ct_FP8_BLOCK", "fp8_block_ue8m0")
NEW_TOKENS = 8
W8A8_ATOL = 0.05  # activation quantization error in logprobs of O(1) values


def _prompt_logprobs(llm, ref_dir, prompts):
    import transformers

    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    hf = transformers.AutoModelForCausalLM.from_pretrained(ref_dir).eval()
    got, expected = [], []
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            ref = hf(torch.tensor([prompt])).logits[0].float().log_softmax(-1)
        expected.append(ref[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])])
        got.append(torch.tensor([d[t].logprob for d, t in zip(out.prompt_logprobs[1:],
                                                                prompt[1:])]))
    return torch.cat(got), torch.cat(expected)


@pytest.mark.parametrize("kind", WEIGHT_ONLY + W8A8 + MORE_WEIGHT_ONLY + MORE_W8A8)
def test_matches_dequantized_transformers(kind):
    quantized, reference = packed_pair(kind)
    llm = LLM(str(quantized), enforce_eager=True, dtype="float32")
    prompts = random_prompts(3, llm.engine.model_config.vocab_size, seed=3)
    got, expected = _prompt_logprobs(llm, reference, prompts)
    weight_only = kind in WEIGHT_ONLY + MORE_WEIGHT_ONLY
    atol = 1e-4 if weight_only else W8A8_ATOL
    torch.testing.assert_close(got, expected, atol=atol, rtol=1e-4)
    if weight_only:
        params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == hf_greedy(reference, prompts,
                                                                    NEW_TOKENS)
    assert llm.engine.num_used_blocks == 0


# per-tensor FP8 (AutoFP8) and static INT8, through LLM(model=DIR) with nothing else (compiled)
@pytest.mark.parametrize("kind", ["fp8_tensor_static", "fp8_tensor_dynamic", "ct_W8A8_STATIC",
                                  "ct_W8A8_STATIC_ASYM"])
def test_static_and_per_tensor_w8a8_compiled_by_default(kind):
    quantized, reference = packed_pair(kind)
    llm = LLM(model=str(quantized), dtype="float32")
    prompts = random_prompts(3, llm.engine.model_config.vocab_size, seed=3)
    got, expected = _prompt_logprobs(llm, reference, prompts)
    torch.testing.assert_close(got, expected, atol=W8A8_ATOL, rtol=1e-4)
    assert llm.engine.num_used_blocks == 0


@pytest.mark.parametrize("kind", ["gptq_act_order", "awq", "fp8_block", "ct_W8A8"])
def test_bfloat16_activations_close(kind):
    quantized, reference = packed_pair(kind)
    llm = LLM(str(quantized), enforce_eager=True, dtype="bfloat16")
    prompts = random_prompts(2, llm.engine.model_config.vocab_size, seed=4)
    got, expected = _prompt_logprobs(llm, reference, prompts)
    torch.testing.assert_close(got, expected, atol=0.15, rtol=0.05)
