"""Llama 4 text: Llama4ForCausalLM, and Llama4ForConditionalGeneration on text-only prompts,
equal transformers (greedy tokens, prompt logprobs; random norms) over a dense RoPE layer and a
NoPE MoE layer; max_model_len is capped at attention_chunk_size (chunked attention within one
chunk), and what we cannot follow is refused by name."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from compiled_llm import LLM, SamplingParams
from compiled_llm.config import EngineArgs, model_len_bounds
from compiled_llm.worker.loader import build_model_config, load_hf_config
from tests.utils import (
    assert_matches_transformers,
    edited_checkpoint,
    engine_config,
    hf_model,
    make_checkpoint,
    random_prompts,
)


def _random_norms(key: str, value: torch.Tensor, gen: torch.Generator) -> torch.Tensor | None:
    """Norm weights drawn (transformers saves ones: a misplaced norm would never show)."""
    if key.endswith("norm.weight"):
        return value + torch.randn(value.shape, generator=gen) * 0.3
    return None


def test_causal_lm_matches_transformers():
    ckpt = edited_checkpoint("llama4", _random_norms)
    assert_matches_transformers(ckpt, new_tokens=8)


def test_conditional_generation_text_only_matches_transformers():
    ckpt = edited_checkpoint("llama4_vl", _random_norms)
    prompts = random_prompts(2, 300, lo=8, hi=40, seed=4)
    llm = LLM(str(ckpt), enforce_eager=True, dtype="float32")
    assert llm.engine.model_config.architecture == "Llama4ForConditionalGeneration"
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, prompt_logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    llm.shutdown()
    hf = hf_model(ckpt)
    for prompt, out in zip(prompts, outs, strict=True):
        tokens = list(out.outputs[0].token_ids)
        with torch.no_grad():  # one forward over prompt + output: greedy is each row's argmax
            ref = hf(input_ids=torch.tensor([prompt + tokens])).logits[0].log_softmax(-1)
        assert ref[len(prompt) - 1:-1].argmax(-1).tolist() == tokens
        expected = ref[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]
        got = torch.tensor([d[t].logprob
                            for d, t in zip(out.prompt_logprobs[1:], prompt[1:], strict=True)])
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def _with_config(name: str, **changes) -> Path:
    out = Path(tempfile.mkdtemp(prefix=f"cllm-{name}-cfg-"))
    shutil.copytree(make_checkpoint(name), out, dirs_exist_ok=True)
    hf = json.loads((out / "config.json").read_text())
    text = hf.get("text_config", hf)
    text.update(changes)
    (out / "config.json").write_text(json.dumps(hf))
    return out


@pytest.mark.parametrize("name", ["llama4", "llama4_vl"])
def test_max_model_len_capped_at_attention_chunk_size(name):
    ckpt = _with_config(name, attention_chunk_size=16)
    hf = load_hf_config(ckpt)
    assert model_len_bounds(hf) == (16, 16)  # the default max_model_len is the chunk
    assert EngineArgs(model=str(ckpt)).scheduler_config(*model_len_bounds(hf)).max_model_len == 16
    with pytest.raises(ValueError, match="max_model_len 32 exceeds.*attention_chunk_size"):
        LLM(str(ckpt), enforce_eager=True, dtype="float32", max_model_len=32)
    model_cls, cfg = build_model_config(hf)
    with pytest.raises(ValueError, match="max_model_len 32 exceeds attention_chunk_size 16"):
        model_cls(cfg, 32)
    # no chunked layer (every layer NoPE): no cap
    assert model_len_bounds(load_hf_config(_with_config(
        name, attention_chunk_size=16, no_rope_layers=[0, 0],
        layer_types=["full_attention"] * 2)))[0] == 512


@pytest.mark.parametrize("changes, field", [
    ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types"),
    ({"layer_types": ["chunked_attention"]}, "layer_types"),
    ({"attention_chunk_size": None}, "attention_chunk_size"),
    ({"no_rope_layers": [1]}, "no_rope_layers"),
    ({"quantization_config": {"quant_method": "fp8"}}, "quantization_config"),
])
def test_refused_by_name(changes, field):
    with pytest.raises(ValueError, match=field):
        engine_config("llama4", **changes)

