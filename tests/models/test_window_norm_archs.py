"""Cohere 2, EXAONE 4.0 and HunYuan dense: equal to transformers on checkpoints whose norm
weights are random (so a norm's place, before or after RoPE, shows), their config keys read as
transformers reads them, and what the engine refuses by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from compiled_llm import LLM
from compiled_llm.worker.loader import build_model_config, load_hf_config
from tests.utils import (
    assert_matches_transformers,
    edited_checkpoint,
    make_checkpoint,
)

NAMES = ["cohere2", "exaone4", "exaone4_global", "hunyuan", "hunyuan_alpha"]


def _random_norm(key: str, value: torch.Tensor, gen: torch.Generator):
    return 0.5 + torch.rand(value.shape, generator=gen) if "norm" in key else None


def random_norms(name: str) -> Path:
    """make_checkpoint(name) with every norm weight drawn from [0.5, 1.5) (transformers
    initialises them to ones, under which a per-head norm commutes with RoPE)."""
    return edited_checkpoint(name, _random_norm)


@pytest.mark.parametrize("name", NAMES)
def test_matches_transformers_with_random_norms(name):
    assert_matches_transformers(random_norms(name))


def test_window_layers_and_rope_layers():
    """Cohere 2 and EXAONE 4.0 turn RoPE on their sliding layers alone; EXAONE 4.0 without a
    window turns it on every layer; a HunYuan alpha stretches the base."""
    _, cfg = build_model_config(load_hf_config(make_checkpoint("cohere2")))
    assert (cfg.sliding_window_layers, cfg.rope_layers, cfg.logit_scale) == ((0,), (0,), 0.5)
    _, cfg = build_model_config(load_hf_config(make_checkpoint("exaone4")))
    assert (cfg.sliding_window_layers, cfg.rope_layers, cfg.head_dim) == ((0,), (0,), 32)
    _, cfg = build_model_config(load_hf_config(make_checkpoint("exaone4_global")))
    assert (cfg.sliding_window, cfg.rope_layers) == (-1, (0, 1))
    _, cfg = build_model_config(load_hf_config(make_checkpoint("hunyuan_alpha")))
    assert cfg.rope_scaling["rope_type"] == "default"
    assert cfg.rope_theta == pytest.approx(1e4 * 1000.0 ** (16 / 14))


@pytest.mark.parametrize("name", ["cohere2", "exaone4"])
def test_layer_types_from_sliding_window_pattern(name):
    """A config.json without layer_types: every sliding_window_pattern-th layer (4 by
    default) attends fully (transformers' rule); a string pattern needs layer_types."""
    hf = {key: value for key, value in load_hf_config(make_checkpoint(name)).items()
          if key != "layer_types"}
    _, cfg = build_model_config({**hf, "num_hidden_layers": 5})
    assert (cfg.sliding_window_layers, cfg.rope_layers) == ((0, 1, 2, 4), (0, 1, 2, 4))
    _, cfg = build_model_config({**hf, "num_hidden_layers": 4, "sliding_window_pattern": 2})
    assert cfg.sliding_window_layers == (0, 2)
    with pytest.raises(ValueError, match="sliding_window_pattern 'LLLG'"):
        build_model_config({**hf, "sliding_window_pattern": "LLLG"})
    layer_types = ["sliding_attention"] * 3 + ["full_attention"]
    _, cfg = build_model_config({**hf, "num_hidden_layers": 4, "layer_types": layer_types,
                                 "sliding_window_pattern": "LLLG"})
    assert cfg.rope_layers == (0, 1, 2)


def test_unread_keys_and_refusals():
    """HunYuan checkpoints' num_experts 1 and use_qk_norm are unread (a dense MLP, q/k norms
    always); a non-numeric alpha is refused by name; EXAONE 4.0's pipeline parallelism too."""
    hf = load_hf_config(make_checkpoint("hunyuan"))
    _, cfg = build_model_config({**hf, "num_experts": 1, "use_qk_norm": False,
                                 "mlp_bias": True})
    assert (cfg.moe, cfg.mlp_bias, cfg.attention_bias, cfg.o_proj_bias) == (
        None, False, True, True)
    with pytest.raises(ValueError, match="rope_scaling.alpha must be a number"):
        build_model_config({**hf, "rope_scaling": {"type": "dynamic", "alpha": "x"}})
    with pytest.raises(ValueError, match="pipeline_parallel_size 2: Exaone4ForCausalLM"):
        LLM(str(make_checkpoint("exaone4")), dtype="float32", enforce_eager=True,
            engine_core_process=False, pipeline_parallel_size=2)
