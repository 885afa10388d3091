"""The ALiBi architectures (the attention op's per-head slopes in place of RoPE): Bloom (the
residual before or after each LayerNorm, a BloomModel checkpoint without the transformer.
prefix), MPT (its slopes, clamped Wqkv, its own softmax scale) and Falcon-RW (Falcon with
alibi); each equals transformers on checkpoints with random norms and biases, and what the
engine cannot follow is refused by name."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from compiled_llm.models.alibi import bloom_alibi_slopes, mpt_alibi_slopes
from compiled_llm.worker.loader import build_model_config, load_hf_config
from tests.utils import assert_matches_transformers, edited_checkpoint, make_checkpoint


def _random_norms(key: str, value: torch.Tensor, gen: torch.Generator) -> torch.Tensor | None:
    """LayerNorm weights around 1 and every bias drawn (transformers saves ones and zeros)."""
    if "norm" in key or "ln_f" in key:
        return torch.randn(value.shape, generator=gen) * 0.3 + (
            1.0 if key.endswith("weight") else 0.0)
    return torch.randn(value.shape, generator=gen) * 0.1 if key.endswith("bias") else None


@pytest.mark.parametrize("num_heads", [1, 6, 12, 16, 48, 112])
def test_slopes_are_transformers(num_heads):
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    torch.testing.assert_close(bloom_alibi_slopes(num_heads),
                               _get_alibi_slopes(num_heads, torch.device("cpu")))
    bias = build_mpt_alibi_tensor(num_heads, 2)  # [H, 1, 2]: slope * (-1, 0)
    torch.testing.assert_close(mpt_alibi_slopes(num_heads), -bias[:, 0, 0])


@pytest.mark.parametrize("name", ["bloom", "mpt", "falcon_alibi"])
def test_equals_transformers(name):
    assert_matches_transformers(edited_checkpoint(name, _random_norms), hi=120)


def test_bloom_model_checkpoint_without_prefix_equals_transformers():
    # bloom-560m ships BloomModel's names (h.0..., word_embeddings...), its head tied
    ckpt = edited_checkpoint("bloom_post_ln", _random_norms)
    for path in ckpt.glob("*.safetensors"):
        tensors = load_file(path)
        save_file({key.removeprefix("transformer."): value for key, value in tensors.items()},
                  path, metadata={"format": "pt"})
    assert_matches_transformers(ckpt, hi=120)


@pytest.mark.parametrize(("key", "value", "match"), [
    ("expansion_ratio", 2, "expansion_ratio=2 is not supported"),
    ("no_bias", False, "no_bias=False is not supported"),
    ("attn_config", {"qk_ln": True}, "attn_config.qk_ln=True is not supported"),
    ("attn_config", {"alibi_bias_max": 16}, "attn_config.alibi_bias_max=16 is not supported"),
    ("attn_config", {"rope": True}, "attn_config.rope=True is not supported"),
    ("attn_config", {"sliding_window_size": 16}, "sliding_window_size=16 is not supported"),
])
def test_mpt_options_transformers_ignores_are_refused_by_name(key, value, match):
    hf = load_hf_config(make_checkpoint("mpt"))
    with pytest.raises(ValueError, match=match):
        build_model_config({**hf, key: value})


def test_bloom_slow_but_exact_is_refused_by_name():
    hf = load_hf_config(make_checkpoint("bloom"))
    with pytest.raises(ValueError, match="slow_but_exact=True with pretraining_tp > 1"):
        build_model_config({**hf, "pretraining_tp": 2, "slow_but_exact": True})
    build_model_config({**hf, "pretraining_tp": 4})  # bloom-176b's: the exact path
