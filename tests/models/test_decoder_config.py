"""DecoderConfig.from_hf on config.json variants: which layers slide, biases, activations."""

from __future__ import annotations

import pytest

from compiled_llm.models import DecoderConfig

BASE = {"vocab_size": 32, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 4,
        "num_attention_heads": 2}


def test_sliding_window_layers_follow_layer_types():
    cfg = DecoderConfig.from_hf({**BASE, "use_sliding_window": True, "sliding_window": 8,
                                 "layer_types": ["full_attention", "sliding_attention"] * 2})
    assert [cfg.layer_window(i) for i in range(4)] == [-1, 8, -1, 8]


def test_sliding_window_layers_from_max_window_layers():
    # an older Qwen2 config.json: no layer_types, the window from max_window_layers on
    cfg = DecoderConfig.from_hf({**BASE, "use_sliding_window": True, "sliding_window": 8,
                                 "max_window_layers": 3})
    assert [cfg.layer_window(i) for i in range(4)] == [-1, -1, -1, 8]
    off = DecoderConfig.from_hf({**BASE, "use_sliding_window": False, "sliding_window": 8,
                                 "max_window_layers": 0})
    assert [off.layer_window(i) for i in range(4)] == [-1] * 4


def test_sliding_window_every_layer_without_layer_types():  # Mistral, Mixtral
    cfg = DecoderConfig.from_hf({**BASE, "sliding_window": 8})
    assert [cfg.layer_window(i) for i in range(4)] == [8] * 4


def test_o_proj_bias_follows_attention_bias_unless_the_model_says():
    llama = DecoderConfig.from_hf({**BASE, "attention_bias": True, "mlp_bias": True})
    assert llama.attention_bias and llama.o_proj_bias and llama.mlp_bias
    qwen2 = DecoderConfig.from_hf(BASE, attention_bias=True, o_proj_bias=False)
    assert qwen2.attention_bias and not qwen2.o_proj_bias and not qwen2.mlp_bias


def test_unsupported_activation_refused():
    with pytest.raises(ValueError, match="hidden_act 'gelu' is not supported"):
        DecoderConfig.from_hf({**BASE, "hidden_act": "gelu"})
