"""Block-FP8 mixture-of-experts: a Qwen3-MoE checkpoint in the published per-expert layout
loads with LLM(model=DIR) alone, its experts stay FP8 (stacked, with their block scales), and
it agrees with transformers running the dequantized weights in float32 (prompt logprobs
close, greedy tokens equal but for near-ties that activation rounding flips); quantization="fp8"
quantizes bf16 experts at load (tests/worker/test_moe_loading.py: sizes off the block refused)."""

from __future__ import annotations

import pytest
import torch

from compiled_llm import LLM, SamplingParams
from compiled_llm.quantization.moe_fp8 import Fp8FusedMoE
from tests.quantization.packers import fp8_moe_pair
from tests.quantization.test_checkpoints import W8A8_ATOL, _prompt_logprobs
from tests.utils import random_prompts

NEW_TOKENS = 6


def _assert_greedy_up_to_ties(reference, prompts, generated) -> None:
    """Each generated token is transformers' greedy choice after the same prefix, or within
    W8A8_ATOL of it in logprob (activation rounding may flip a near-tie of a random model)."""
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(reference).eval()
    exact = 0
    for prompt, tokens in zip(prompts, generated):
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + tokens[:-1]])).logits[0, len(prompt) - 1:]
        logprobs = logits.float().log_softmax(-1)
        best = logprobs.max(-1).values
        ours = logprobs[torch.arange(len(tokens)), torch.tensor(tokens)]
        assert (best - ours).max().item() < W8A8_ATOL, (tokens, logprobs.argmax(-1).tolist())
        exact += int(torch.equal(logprobs.argmax(-1), torch.tensor(tokens)))
    assert exact >= len(prompts) - 1  # near-ties are rare: most sequences match exactly


def _experts(llm) -> list:
    model = llm.engine.executor.worker.runner.model
    return [m for m in model.modules() if isinstance(m, Fp8FusedMoE)]


@pytest.fixture(scope="module")
def fp8_llm():
    quantized, reference = fp8_moe_pair()
    return LLM(str(quantized), enforce_eager=True, dtype="float32"), reference


def test_checkpoint_experts_stay_fp8_and_match_dequantized(fp8_llm):
    llm, reference = fp8_llm
    experts = _experts(llm)
    assert len(experts) == 2
    assert experts[0].w13_weight.dtype == torch.float8_e4m3fn
    assert tuple(experts[0].w13_weight_scale_inv.shape) == (4, 2, 1)  # [E, 2I/128, H/128]
    router = llm.engine.executor.worker.runner.model.model.layers[0].mlp.gate
    assert type(router) is torch.nn.Linear and router.weight.dtype == torch.float32
    prompts = random_prompts(3, llm.engine.model_config.vocab_size, seed=3)
    got, expected = _prompt_logprobs(llm, reference, prompts)
    torch.testing.assert_close(got, expected, atol=W8A8_ATOL, rtol=1e-4)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    _assert_greedy_up_to_ties(reference, prompts, [o.outputs[0].token_ids for o in outs])
    assert llm.engine.num_used_blocks == 0


def test_quantize_at_load_makes_block_fp8_experts():
    _, reference = fp8_moe_pair()
    llm = LLM(str(reference), enforce_eager=True, dtype="float32", quantization="fp8")
    assert len(_experts(llm)) == 2
    prompts = random_prompts(2, llm.engine.model_config.vocab_size, seed=5)
    got, expected = _prompt_logprobs(llm, reference, prompts)
    torch.testing.assert_close(got, expected, atol=2 * W8A8_ATOL, rtol=1e-3)


def test_other_formats_refuse_moe_models():
    from compiled_llm.models import DecoderConfig
    from compiled_llm.quantization.formats import GptqFormat
    from compiled_llm.quantization.loading import prepare_quantized

    model = torch.nn.Module()
    model.config = DecoderConfig.from_hf({"vocab_size": 8, "hidden_size": 8,
                                          "intermediate_size": 8, "num_hidden_layers": 1,
                                          "num_attention_heads": 1, "num_experts": 2,
                                          "num_experts_per_tok": 1})
    with pytest.raises(ValueError, match="gptq checkpoints of mixture-of-experts models"):
        prepare_quantized(model, GptqFormat(128), [])
