"""Bare decoders saved as HF's LlamaModel / MistralModel / Qwen2Model / Qwen3Model (embedding
checkpoints such as e5-mistral): served for pooling by default, their last-token states equal
transformers', normalised by default, no lm_head."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import pytest
import torch

from compiled_llm import LLM
from compiled_llm.pooling_params import PoolingParams
from tests.entrypoints.pooling.checkpoints import assert_compiled_matches_eager
from tests.utils import SMALL, random_prompts, tokenizer_dir


@functools.cache
def bare(kind: str) -> Path:
    """A tiny random bare decoder of `kind`, saved as transformers saves AutoModel's."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir())
    config_cls = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
                  "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[kind]
    cfg = config_cls(vocab_size=len(tok), eos_token_id=tok.eos_token_id, **SMALL)
    torch.manual_seed(3)
    model = transformers.AutoModel.from_config(cfg)
    out = Path(tempfile.mkdtemp(prefix=f"cllm-bare-{kind}-"))
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2", "qwen3"])
def test_bare_decoder_embeds_as_transformers(kind):
    import transformers

    ckpt = bare(kind)
    prompts = [{"prompt_token_ids": p} for p in random_prompts(3, 300, lo=3, hi=30, seed=2)]
    llm = LLM(str(ckpt), enforce_eager=True, dtype="float32")
    assert llm.runner_type == "pooling"
    raw = llm.embed(prompts, PoolingParams(normalize=False))
    unit = llm.embed(prompts)
    hf = transformers.AutoModel.from_pretrained(ckpt).eval()
    for prompt, out, normed in zip(prompts, raw, unit):
        with torch.no_grad():
            ref = hf(torch.tensor([prompt["prompt_token_ids"]])).last_hidden_state[0, -1]
        torch.testing.assert_close(torch.tensor(out.outputs.embedding), ref, atol=1e-4,
                                   rtol=1e-4)
        torch.testing.assert_close(torch.tensor(normed.outputs.embedding),
                                   ref / ref.norm(), atol=1e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="runner"):
        llm.generate(prompts[0])
    llm.shutdown()


def test_compiled_bare_decoder_matches_eager():
    prompts = [{"prompt_token_ids": p} for p in random_prompts(3, 300, lo=3, hi=30, seed=4)]
    assert_compiled_matches_eager(  # split at its 2 attentions
        bare("qwen3"), lambda llm: [o.outputs.embedding for o in llm.embed(prompts)], 2 + 1)


@functools.cache
def embedding_gemma() -> Path:
    """A tiny random bidirectional Gemma3TextModel (EmbeddingGemma's shape of config) with
    sliding layers of a 4-token window, so the window shows on the test's prompts."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir())
    cfg = transformers.Gemma3TextConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=4,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        use_bidirectional_attention=True, max_position_embeddings=256, query_pre_attn_scalar=16)
    torch.manual_seed(5)
    model = transformers.Gemma3TextModel(cfg)
    out = Path(tempfile.mkdtemp(prefix="cllm-embgemma-"))
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


@pytest.mark.parametrize("enforce_eager", [True, False])
def test_bidirectional_gemma3_embeds_as_transformers(enforce_eager):
    import transformers

    ckpt = embedding_gemma()
    prompts = [{"prompt_token_ids": p} for p in random_prompts(3, 300, lo=3, hi=30, seed=8)]
    llm = LLM(str(ckpt), enforce_eager=enforce_eager, dtype="float32",
              pooler_config={"pooling_type": "MEAN", "normalize": False})
    outs = llm.embed(prompts)
    hf = transformers.AutoModel.from_pretrained(ckpt).eval()
    for prompt, out in zip(prompts, outs):
        with torch.no_grad():
            ref = hf(torch.tensor([prompt["prompt_token_ids"]])).last_hidden_state[0].mean(0)
        torch.testing.assert_close(torch.tensor(out.outputs.embedding), ref, atol=1e-4,
                                   rtol=1e-4)
    llm.shutdown()
