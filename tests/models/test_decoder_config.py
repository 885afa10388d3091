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
    with pytest.raises(ValueError, match="hidden_act 'xielu' is not supported"):
        DecoderConfig.from_hf({**BASE, "hidden_act": "xielu"})  # has parameters of its own
    moe = {**BASE, "num_experts": 4, "num_experts_per_tok": 2, "hidden_act": "gelu"}
    with pytest.raises(ValueError, match="hidden_act 'gelu' is not supported with mixture"):
        DecoderConfig.from_hf(moe)  # the fused expert op is SiLU-gated
    assert DecoderConfig.from_hf({**BASE, "hidden_act": "gelu"}).hidden_act == "gelu"


def _windows(model_cls, hf_config: dict) -> list[int]:
    config_cls = getattr(model_cls, "config_cls", DecoderConfig)  # as the loader reads it
    cfg = config_cls.from_hf(hf_config, **model_cls.hf_defaults)
    return [cfg.layer_window(i) for i in range(hf_config["num_hidden_layers"])]


def test_older_qwen2_moe_config_slides_as_transformers_derives_it():
    import transformers

    from compiled_llm.models.qwen2_moe import Qwen2MoeForCausalLM

    for extra in ({"max_window_layers": 3}, {}, {"max_window_layers": 3, "layer_types": None}):
        old = {**BASE, "num_experts": 4, "num_experts_per_tok": 2, "use_sliding_window": True,
               "sliding_window": 8, **extra}  # no layer_types: HF's Qwen2MoeConfig makes them
        hf = transformers.Qwen2MoeConfig(**old)
        expected = [8 if kind == "sliding_attention" else -1 for kind in hf.layer_types]
        assert _windows(Qwen2MoeForCausalLM, old) == expected
    assert expected == [8, -1, 8, -1]
    assert _windows(Qwen2MoeForCausalLM, {**BASE, "num_experts": 4, "num_experts_per_tok": 2,
                                          "sliding_window": 8}) == [-1] * 4  # HF: off unset


def test_qwen3_moe_window_is_on_every_layer():
    from compiled_llm.models.qwen3_moe import Qwen3MoeForCausalLM

    moe = {**BASE, "num_experts": 4, "num_experts_per_tok": 2, "sliding_window": 8}
    on = {**moe, "use_sliding_window": True, "max_window_layers": 2,
          "layer_types": ["full_attention"] * 4}  # HF's Qwen3-MoE reads neither
    assert _windows(Qwen3MoeForCausalLM, on) == [8] * 4
    assert _windows(Qwen3MoeForCausalLM, moe) == [-1] * 4


YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "original_max_position_embeddings": 32}


def test_yarn_without_factor_is_refused_by_name():
    for key in ("rope_scaling", "rope_parameters"):  # transformers: a KeyError on load
        with pytest.raises(ValueError, match=r"rope_scaling\.factor is required"):
            DecoderConfig.from_hf({**BASE, "max_position_embeddings": 128, key: YARN})
    with pytest.raises(ValueError, match=r"rope_scaling\.factor must be a number"):
        DecoderConfig.from_hf({**BASE, "rope_scaling": {"rope_type": "linear", "factor": None}})


def test_yarn_null_factor_is_the_length_ratio_as_in_transformers():
    import torch
    import transformers
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    from compiled_llm.models.rotary import RotaryEmbedding

    rope = {**YARN, "factor": None}
    hf_cfg = transformers.Qwen3Config(**BASE, head_dim=16, max_position_embeddings=128,
                                      rope_parameters=dict(rope))
    cfg = DecoderConfig.from_hf({**BASE, "head_dim": 16, "max_position_embeddings": 128,
                                 "rope_scaling": rope})
    assert cfg.rope_scaling["factor"] == 4.0  # max_position_embeddings / original
    positions = torch.arange(128)
    cos, sin = Qwen3RotaryEmbedding(hf_cfg)(torch.zeros(1), positions[None])
    ours_cos, ours_sin = RotaryEmbedding(cfg, 128)(positions)
    torch.testing.assert_close(ours_cos[:, 0], cos[0])
    torch.testing.assert_close(ours_sin[:, 0], sin[0])


def test_qwen2_classifier_reads_config_json_as_qwen2_does():
    from compiled_llm.models.llama import Qwen2ForCausalLM
    from compiled_llm.models.llama_cls import Qwen2ForSequenceClassification

    unset = {**BASE, "sliding_window": 8, "max_window_layers": 2}  # use_sliding_window absent
    assert _windows(Qwen2ForSequenceClassification, unset) == [-1] * 4  # HF: off unless set
    assert _windows(Qwen2ForSequenceClassification, unset) == _windows(Qwen2ForCausalLM, unset)
    on = {**unset, "use_sliding_window": True}
    assert _windows(Qwen2ForSequenceClassification, on) == [-1, -1, 8, 8]
