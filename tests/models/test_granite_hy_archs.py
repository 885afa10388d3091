"""HyperCLOVA X, Hy3 and Granite SWA: equal to transformers on checkpoints whose norms, biases,
sinks and correction biases are random (transformers saves ones and zeros, under which a
misplaced norm, sink or bias never shows), their config keys read as transformers reads them,
and what the engine refuses by name."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.worker.loader import build_model_config, load_hf_config
from tests.utils import (
    assert_matches_transformers,
    edited_checkpoint,
    engine_config,
    make_checkpoint,
)


def _biting(key: str, value: torch.Tensor, gen: torch.Generator) -> torch.Tensor | None:
    if "norm" in key:
        return 0.5 + torch.rand(value.shape, generator=gen)
    if key.endswith(("sinks", "expert_bias")):  # an expert_bias within sigmoid's scale
        return torch.randn(value.shape, generator=gen) * (1.0 if "sinks" in key else 0.3)
    if key.endswith("bias"):
        return torch.randn(value.shape, generator=gen) * 0.1
    return None


@pytest.mark.parametrize("name", ["hyperclovax", "hyperclovax_plain", "hy_v3", "granite_swa"])
def test_matches_transformers(name):
    assert_matches_transformers(edited_checkpoint(name, _biting), hi=40)


def test_config_keys_read_as_transformers_reads_them():
    """HyperCLOVA X's attention_multiplier defaults to head_dim ** -0.5; Hy3's dense layers
    are mlp_layer_types' (default: the first), its RoPE base 11158840 unless given; Granite
    SWA's layer_types default to every fourth layer full, its bases to rope_theta."""
    cfg = engine_config("hyperclovax_plain", drop=("attention_multiplier",))
    assert (cfg.attention_multiplier, cfg.use_post_norm) == (16**-0.5, False)
    cfg = engine_config("hy_v3", drop=("mlp_layer_types", "rope_parameters"))
    assert (cfg.moe.mlp_only_layers, cfg.rope_theta, cfg.routed_scaling_factor) == (
        (0,), 11_158_840.0, 2.5)
    assert (cfg.moe.shared_expert_intermediate_size, cfg.moe.norm_topk_prob) == (64, True)
    cfg = engine_config("granite_swa", drop=("layer_types", "layer_rope_theta"),
                        num_hidden_layers=5)
    assert (cfg.sliding_window_layers, cfg.layer_rope_theta) == ((1, 2, 3), (1e4,) * 5)


def test_hy_v3_weight_names():
    """Hy3's multi-token-prediction layer (index num_hidden_layers) is skipped; its own names
    and transformers 5's stacked experts land in ours."""
    model_cls, cfg = build_model_config(load_hf_config(make_checkpoint("hy_v3")))
    model = model_cls(cfg, 64)
    assert model.weight_name("model.layers.2.mlp.router.gate.weight") is None
    prefix = "model.layers.0.mlp."
    assert [model.weight_name(prefix + name) for name in (
        "expert_bias", "e_score_correction_bias", "router.gate.weight",
        "shared_mlp.up_proj.weight", "experts.gate_up_proj", "experts.down_proj")] == [
        prefix + name for name in (
            "gate.e_score_correction_bias", "gate.e_score_correction_bias", "gate.weight",
            "shared_expert.up_proj.weight", "experts.w13_weight", "experts.w2_weight")]



@pytest.mark.parametrize("name, changes, match", [
    ("hy_v3", {"mlp_bias": True}, "mlp_bias True"),
    ("hy_v3", {"num_shared_experts": 0}, "num_shared_experts 0"),
    ("hy_v3", {"mlp_layer_types": ["sparse"]}, "mlp_layer_types"),
    ("granite_swa", {"layer_rope_theta": [1e4]}, "layer_rope_theta"),
    ("granite_swa", {"layer_types": ["chunked_attention"] * 3}, "layer_types"),
    ("granite_swa", {"sliding_window": None}, "sliding_window None"),
])
def test_refusals(name, changes, match):
    with pytest.raises(ValueError, match=match):
        engine_config(name, **changes)
