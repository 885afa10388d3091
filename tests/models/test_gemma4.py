"""Gemma 4's text decoder equal to transformers on checkpoints with random norms and scalars
(E2B's shape: PLE, KV-shared layers with double-wide MLPs; 26B-A4B's: keys as values on the
global layers, a dense MLP beside experts), its config keys read as transformers reads them,
the KV caches of shared layers left unallocated, and what it refuses by name."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.models.gemma4 import Gemma4ForCausalLM
from compiled_llm.worker.kv_cache import allocate_caches, initial_scales, layer_kv_shapes
from tests.utils import (
    assert_matches_transformers,
    edited_checkpoint,
    engine_config,
)


def _random_norms_and_scalars(key: str, value: torch.Tensor, gen: torch.Generator):
    """transformers saves ones for these; drawn away from 1 so a misplaced one shows."""
    if "norm" in key or key.endswith(("layer_scalar", "router.scale", "per_expert_scale")):
        return value + 0.3 * torch.randn(value.shape, generator=gen)
    return None


@pytest.mark.parametrize("name", ["gemma4", "gemma4_moe"])
def test_random_norms_match_transformers(name):
    assert_matches_transformers(edited_checkpoint(name, _random_norms_and_scalars), hi=40)


_config = engine_config


def test_layer_shapes_kv_sources_and_cache_shapes():
    cfg = _config("gemma4")
    assert [cfg.layer_shape(i) for i in range(4)] == [(2, 16), (2, 32)] * 2
    assert [cfg.kv_source(i) for i in range(4)] == [0, 1, 0, 1]
    assert layer_kv_shapes(cfg) == [(2, 16), (2, 32), (0, 16), (0, 32)]
    caches = allocate_caches(cfg, 3, 4, torch.float32, torch.device("cpu"))
    assert [tuple(c.shape) for c in caches] == [(2, 3, 4, 2, 16), (2, 3, 4, 2, 32),
                                               (2, 3, 4, 0, 16), (2, 3, 4, 0, 32)]
    assert (cfg.hidden_size_per_layer_input, cfg.use_double_wide_mlp, cfg.moe) == (8, True, None)
    moe = _config("gemma4_moe")
    assert [moe.layer_shape(i) for i in range(2)] == [(2, 16), (1, 32)]
    assert (moe.moe.num_experts, moe.moe.num_experts_per_tok, moe.moe_activation) == (
        4, 2, "gelu_tanh")


def test_weight_names_skip_shared_layers_kv_and_stack_experts():
    """Checkpoints may carry K/V weights for the KV-shared layers (transformers ignores them);
    the stacked experts load into FusedMoE's w13 / w2."""
    model = Gemma4ForCausalLM(_config("gemma4"), max_len=64)
    for name in ("k_proj.weight", "v_proj.weight", "k_norm.weight", "v_norm.weight"):
        assert model.weight_name(f"model.layers.2.self_attn.{name}") is None
    name = "model.layers.1.self_attn.k_proj.weight"
    assert model.weight_name(name) == name
    assert model.weight_name("model.layers.1.experts.gate_up_proj") == (
        "model.layers.1.experts.w13_weight")
    shared = model.model.layers[3]
    assert not hasattr(shared.self_attn, "k_proj") and shared.mlp.up_proj.out_features == 256


def test_released_spelling_global_head_dim_and_defaults():
    """config.json as Google released it: global_head_dim / num_global_key_value_heads, no
    per_layer_config; num_global_key_value_heads counts only with attention_k_eq_v."""
    cfg = _config("gemma4_moe", drop=("per_layer_config",), global_head_dim=64,
                  num_global_key_value_heads=1)
    assert cfg.layer_shape(1) == (1, 64)
    cfg = _config("gemma4_moe", drop=("per_layer_config",), attention_k_eq_v=False,
                  num_global_key_value_heads=1)
    assert cfg.layer_shape(1) == (2, 512)  # transformers' default global_head_dim
    cfg = _config("gemma4", drop=("rope_parameters", "layer_types", "per_layer_config"),
                  num_hidden_layers=3,
                  num_kv_shared_layers=0)
    assert [cfg.is_sliding(i) for i in range(3)] == [True, True, False]  # last forced full
    assert (cfg.rope_scaling["rope_type"], cfg.rope_scaling["partial_rotary_factor"],
            cfg.rope_theta, cfg.local_rope_theta) == ("proportional", 0.25, 1e6, 1e4)
    cfg = _config("gemma4", use_bidirectional_attention="vision", enable_moe_block=False,
                  num_experts=8)  # text only: causal; experts unread without the MoE block
    assert cfg.moe is None


@pytest.mark.parametrize("changes, match", [
    ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "rope_parameters"),
    ({"rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0},
                          "full_attention": {"rope_type": "default"}}}, "rope_type 'linear'"),
    ({"num_kv_shared_layers": 4}, "num_kv_shared_layers 4"),
    ({"num_kv_shared_layers": 3}, "num_kv_shared_layers 3"),  # no full layer before layer 1
    ({"vocab_size_per_layer_input": 100}, "vocab_size_per_layer_input"),
    ({"per_layer_config": {"0": {"head_dim": 32}}}, "per_layer_config"),
    ({"per_layer_config": {"1": {"intermediate_size": 32}}}, "per_layer_config"),
    ({"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2}, "moe_intermediate_size"),
    ({"enable_moe_block": True, "num_experts": 4, "top_k_experts": 2,
      "moe_intermediate_size": 8, "hidden_activation": "relu"}, "hidden_activation"),
])
def test_refused_by_name(changes, match):
    with pytest.raises(ValueError, match=match):
        _config("gemma4", **changes)


def test_fp8_kv_cache_refused_with_layers_of_different_shapes():
    with pytest.raises(ValueError, match="kv_cache_dtype fp8"):
        initial_scales(_config("gemma4"), None, torch.device("cpu"))


def test_lora_refused_by_name():
    from compiled_llm.lora.manager import LoRAManager, LoRASettings

    model = Gemma4ForCausalLM(_config("gemma4"), 64)
    with pytest.raises(ValueError, match="enable_lora: Gemma4ForCausalLM takes no LoRA"):
        LoRAManager(model, LoRASettings(1, 8, 1), 16)
