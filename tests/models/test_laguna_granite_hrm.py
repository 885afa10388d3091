"""Laguna, Granite MoE SWA and HRM-Text: equal to transformers on checkpoints whose norms,
biases, sinks, correction biases and z_L_init are random (transformers saves ones and zeros,
under which a misplaced norm, sink or bias never shows), and what each cannot follow refused
by name."""

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
    """Norm weights around 1, sinks, biases, correction biases and z_L_init drawn."""
    noise = torch.randn(value.shape, generator=gen)
    if "norm" in key:
        return 1 + 0.3 * noise
    if key.endswith(("sinks", "z_L_init")):
        return noise
    if key.endswith("bias"):  # correction biases within sigmoid's scale
        return 0.3 * noise
    return None


@pytest.mark.parametrize("name", ["laguna", "granitemoe_swa", "hrm_text"])
def test_matches_transformers(name):
    assert_matches_transformers(edited_checkpoint(name, _biting), hi=40)


def test_config_keys_and_weight_names_read_as_transformers_reads_them():
    """HRM-Text's KV slots: num_layers_per_stack * H_cycles * (L_cycles + 1), a legacy config's
    num_hidden_layers being the per-stack depth; Laguna's per-type RoPE and head counts, and
    transformers' own MoE names beside the checkpoints'."""
    for drop in ((), ("num_layers_per_stack",)):
        cfg = engine_config("hrm_text", drop=drop, num_hidden_layers=2 if drop else 8)
        assert (cfg.num_hidden_layers, cfg.num_layers_per_stack) == (8, 2)
    model_cls, cfg = build_model_config(load_hf_config(make_checkpoint("laguna")))
    assert cfg.layer_rope == {True: (1e4, 16), False: (5e5, 8)}
    assert (cfg.heads_per_layer, cfg.moe.mlp_only_layers, cfg.gate_per_head) == (
        (4, 2, 4), (0,), True)
    prefix = "model.layers.1.mlp."
    assert [model_cls.weight_name(prefix + name) for name in (
        "shared_experts.up_proj.weight", "gate.e_score_correction_bias", "experts.down_proj",
        "experts.e_score_correction_bias")] == [prefix + name for name in (
        "shared_expert.up_proj.weight", "e_score_correction_bias", "experts.w2_weight",
        "e_score_correction_bias")]


@pytest.mark.parametrize("name, changes, match", [
    ("laguna", {"moe_apply_router_weight_on_input": True}, "moe_apply_router_weight_on_input"),
    ("laguna", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}},
     "rope_parameters.full_attention"),
    ("laguna", {"num_attention_heads_per_layer": [4, 3, 4]}, "num_attention_heads_per_layer"),
    ("granitemoe_swa", {"layer_rope_theta": [1e4]}, "layer_rope_theta"),
    ("hrm_text", {"H_cycles": 0}, "H_cycles"),
])
def test_refusals(name, changes, match):
    hf = {**load_hf_config(make_checkpoint(name)), **changes}
    with pytest.raises(ValueError, match=match):
        build_model_config(hf)
