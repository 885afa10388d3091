"""Nemotron and more dense decoders beyond the transformers sweep's configs: equal to
transformers on checkpoints whose norm weights and biases are random (transformers initialises
them to ones and zeros, under which a misplaced norm offset or bias never shows), their config
keys read as transformers reads them, and what the engine refuses by name."""

from __future__ import annotations

import pytest
import torch

from compiled_llm import LLM
from compiled_llm.distributed.pipeline_parallel import check_pipeline
from compiled_llm.worker.loader import build_model_config, load_hf_config
from tests.utils import (
    assert_matches_transformers,
    edited_checkpoint,
    engine_config,
    make_checkpoint,
)

NAMES = ["nemotron", "persimmon", "vaultgemma", "apertus", "ministral3", "cwm", "jais2"]


def _random_norms_and_biases(key: str, value: torch.Tensor, gen: torch.Generator):
    if "norm" in key or key.endswith(".bias") or ".act_fn." in key:  # xIELU's scalars
        return value + 0.3 * torch.randn(value.shape, generator=gen)
    return None


@pytest.mark.parametrize("name", NAMES)
def test_random_norms_and_biases_match_transformers(name):
    assert_matches_transformers(edited_checkpoint(name, _random_norms_and_biases), hi=40)


_config = engine_config


def test_nemotron_config_keys():
    cfg = _config("nemotron", drop=("rope_parameters", "norm_eps", "hidden_act"),
                  rms_norm_eps=0.1, layer_norm_eps=0.1)  # never read: norm_eps is its eps
    assert (cfg.rotary_dim, cfg.layer_norm_eps, cfg.hidden_act) == (8, 1e-5, "relu2")
    cfg = _config("nemotron", partial_rotary_factor=0.25, norm_eps=1e-3)
    assert (cfg.rotary_dim, cfg.layer_norm_eps, cfg.o_proj_bias) == (8, 1e-3, True)


def test_persimmon_config_keys_and_head_dim_refused_by_name():
    cfg = _config("persimmon", drop=("rope_parameters", "qk_layernorm"), attention_bias=False)
    assert (cfg.rotary_dim, cfg.qk_layernorm, cfg.attention_bias) == (8, True, True)
    cfg = _config("persimmon", qk_layernorm=False)  # SMALL's 2 KV heads are never read
    assert (cfg.qk_layernorm, cfg.num_key_value_heads, cfg.head_dim) == (False, 4, 16)
    with pytest.raises(ValueError, match="head_dim 32 is not supported for Persimmon"):
        _config("persimmon", head_dim=32)


def test_vaultgemma_config_keys():
    cfg = _config("vaultgemma", drop=("attn_logit_softcapping", "final_logit_softcapping",
                                      "layer_types"), use_bidirectional_attention=True)
    assert (cfg.attn_logit_softcapping, cfg.final_logit_softcapping) == (50.0, 30.0)
    assert (cfg.sliding_window_layers, cfg.query_pre_attn_scalar) == ((0,), 24.0)
    cfg = _config("vaultgemma", attn_logit_softcapping=None, final_logit_softcapping=None)
    assert (cfg.attn_logit_softcapping, cfg.final_logit_softcapping) == (None, None)


def test_apertus_config_keys():
    cfg = _config("apertus", drop=("hidden_act", "rope_parameters"))  # transformers' defaults
    assert (cfg.hidden_act, cfg.rope_scaling["rope_type"], cfg.rope_theta) == (
        "xielu", "llama3", 12e6)
    cfg = _config("apertus", hidden_act="relu2", mlp_bias=True)  # mlp_bias: never read
    assert (cfg.hidden_act, cfg.mlp_bias, cfg.o_proj_bias) == ("relu2", False, True)


def test_ministral3_config_keys_and_scale_beta_required():
    cfg = _config("ministral3", layer_types=["full_attention", "sliding_attention"],
                  attention_bias=True)  # never read: the window on every layer, no biases
    assert ([cfg.layer_window(i) for i in range(2)], cfg.attention_bias) == ([24, 24], False)
    cfg = _config("ministral3", drop=("rope_parameters", "sliding_window"))
    assert (cfg.rope_scaling["rope_type"], cfg.rope_scaling["llama_4_scaling_beta"],
            cfg.rope_theta, cfg.sliding_window) == ("yarn", 0.1, 1e6, -1)
    hf = load_hf_config(make_checkpoint("ministral3"))
    params = {k: v for k, v in hf["rope_parameters"].items() if k != "llama_4_scaling_beta"}
    with pytest.raises(ValueError, match="rope_parameters.llama_4_scaling_beta is required"):
        build_model_config({**hf, "rope_parameters": params})


def test_cwm_layer_types_and_defaults():
    cfg = _config("cwm", drop=("layer_types",), num_hidden_layers=6)  # layers 0, 4 full
    assert (cfg.sliding_window_layers, cfg.sliding_window) == ((1, 2, 3, 5), 8)
    cfg = _config("cwm", drop=("rope_parameters", "head_dim"), attention_bias=True)
    assert (cfg.rope_scaling["rope_type"], cfg.rope_theta, cfg.head_dim) == (
        "llama3", 1e6, 128)
    assert (cfg.attention_bias, cfg.mlp_bias) == (False, True)


@pytest.mark.parametrize(("name", "arch"), [("nemotron", "NemotronForCausalLM"),
                                            ("persimmon", "PersimmonForCausalLM"),
                                            ("apertus", "ApertusForCausalLM"),
                                            ("jais2", "Jais2ForCausalLM")])
def test_lora_refused_by_name(name, arch):
    ckpt = make_checkpoint(name)
    with pytest.raises(ValueError, match=f"enable_lora: {arch} has no module"):
        LLM(str(ckpt), enable_lora=True, enforce_eager=True)


def test_pipeline_parallelism_as_llama_or_refused_by_name():
    """Every body but VaultGemma's is LlamaModel's layer loop: two stages split it."""
    for name in NAMES:
        model_cls, cfg = build_model_config(load_hf_config(make_checkpoint(name)))
        if name == "vaultgemma":
            with pytest.raises(ValueError, match="pipeline_parallel_size 2: VaultGemma"):
                check_pipeline(model_cls, cfg, 2)
        else:
            check_pipeline(model_cls, cfg, 2)
