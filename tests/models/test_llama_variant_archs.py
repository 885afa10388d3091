"""Ministral, Seed-OSS, Helium, Arcee and ERNIE 4.5 beyond the transformers sweep's configs:
every norm weight and bias random (transformers initialises them to 1 and 0), their config keys
read as transformers reads them (layer_types, attention_out_bias, use_bias, the classes' own
defaults), YaRN on Arcee; and what is refused by name (Helium's head shape, Arcee's tensor
parallelism and LoRA)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from compiled_llm import LLM
from compiled_llm.distributed.pipeline_parallel import check_pipeline
from compiled_llm.worker.loader import build_model_config, load_hf_config
from tests.models.test_config_options import assert_matches_transformers
from tests.utils import engine_config, make_checkpoint, random_prompts

NAMES = ["ministral", "seed_oss", "helium", "arcee", "ernie4_5"]
# with the biases the sweep's configs leave off (Helium's and Arcee's q/k/v and MLP), and YaRN
RANDOMIZED = [*NAMES, "helium_biased", "arcee_yarn"]


def _randomized(name: str, dest, edit=None):
    """A copy of checkpoint `name` whose norm weights and biases are moved by random amounts,
    and whose config.json `edit(config)` changes in place."""
    out = dest / name
    shutil.copytree(make_checkpoint(name), out)
    tensors = load_file(out / "model.safetensors")
    gen = torch.Generator().manual_seed(5)
    for key, value in tensors.items():
        if "norm" in key or key.endswith(".bias"):
            tensors[key] = value + 0.3 * torch.randn(value.shape, generator=gen)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    if edit is not None:
        cfg = json.loads((out / "config.json").read_text())
        edit(cfg)
        (out / "config.json").write_text(json.dumps(cfg))
    return out


_config = engine_config


@pytest.mark.parametrize("name", RANDOMIZED)
def test_random_norms_and_biases_match_transformers(name, tmp_path):
    """Prompts past Ministral's window of 8 and arcee_yarn's original length of 32; every bias
    and norm weight read where it goes."""
    ckpt = _randomized(name, tmp_path)
    assert_matches_transformers(ckpt, random_prompts(3, 300, lo=12, hi=60, seed=4))


def test_ministral_window_on_the_layers_layer_types_marks():
    assert _config("ministral").sliding_window_layers == (0,)
    cfg = _config("ministral", drop=("layer_types",))  # transformers: every layer slides
    assert [cfg.layer_window(i) for i in range(2)] == [8, 8]
    cfg = _config("ministral", drop=("layer_types", "sliding_window"))  # its default window
    assert [cfg.layer_window(i) for i in range(2)] == [4096, 4096]
    cfg = _config("ministral", drop=("layer_types",), sliding_window=None)
    assert [cfg.layer_window(i) for i in range(2)] == [-1, -1]
    # keys transformers' Ministral never reads change nothing
    cfg = _config("ministral", attention_bias=True, use_sliding_window=False, mlp_bias=True)
    assert (cfg.attention_bias, cfg.mlp_bias, cfg.sliding_window) == (False, False, 8)


def test_ministral_without_layer_types_matches_transformers(tmp_path):
    """No layer_types in config.json: the window on every layer, as transformers derives."""
    ckpt = _randomized("ministral", tmp_path, lambda cfg: cfg.pop("layer_types"))
    assert_matches_transformers(ckpt, random_prompts(2, 300, lo=20, hi=40, seed=6))


def test_seed_oss_biases_and_defaults():
    cfg = _config("seed_oss")
    assert (cfg.attention_bias, cfg.o_proj_bias, cfg.mlp_bias, cfg.head_dim) == (
        True, True, False, 32)
    assert _config("seed_oss", mlp_bias=True).mlp_bias
    cfg = _config("seed_oss", drop=("attention_out_bias", "attention_bias", "head_dim"),
                  o_proj_bias=True)  # transformers' defaults; o_proj_bias is no key of its
    assert (cfg.attention_bias, cfg.o_proj_bias, cfg.head_dim) == (True, False, 128)


def test_helium_defaults_and_head_shape_refused_by_name():
    cfg = _config("helium", drop=("rope_parameters", "rms_norm_eps"))
    assert (cfg.rope_theta, cfg.rms_norm_eps, cfg.o_proj_bias) == (100000.0, 1e-8, False)
    with pytest.raises(ValueError, match="head_dim 32 is not supported for HeliumForCausalLM"):
        _config("helium", head_dim=32)


def test_arcee_relu2_and_yarn():
    cfg = _config("arcee", drop=("hidden_act",))  # transformers' default: relu2
    assert cfg.hidden_act == "relu2"
    cfg = _config("arcee_yarn")
    assert (cfg.rope_scaling["rope_type"], cfg.attention_bias, cfg.mlp_bias) == (
        "yarn", True, True)


def test_ernie4_5_use_bias_and_untied_head(tmp_path):
    cfg = _config("ernie4_5", attention_bias=False, mlp_bias=False)  # never read: use_bias
    assert (cfg.attention_bias, cfg.o_proj_bias, cfg.mlp_bias) == (True, True, True)
    assert cfg.tie_word_embeddings
    cfg = _config("ernie4_5", drop=("use_bias", "tie_word_embeddings", "rope_parameters"))
    assert (cfg.attention_bias, cfg.tie_word_embeddings, cfg.rope_theta) == (False, True, 5e5)
    cfg = _config("ernie4_5_plain")
    assert (cfg.attention_bias, cfg.o_proj_bias, cfg.mlp_bias) == (False, False, False)
    assert not cfg.tie_word_embeddings
    ckpt = _randomized("ernie4_5_plain", tmp_path)
    assert_matches_transformers(ckpt, random_prompts(2, 300, lo=10, hi=40, seed=8))


def test_pipeline_parallelism_as_llama():
    """Each body is LlamaModel's layer loop: two stages split it."""
    for name in NAMES:
        check_pipeline(*build_model_config(load_hf_config(make_checkpoint(name))), 2)


def test_arcee_lora_refused_by_name():
    with pytest.raises(ValueError, match="enable_lora: ArceeForCausalLM has no module"):
        LLM(str(make_checkpoint("arcee")), enable_lora=True, enforce_eager=True)
