"""MiMo-V2-Flash: equal to transformers on a checkpoint whose norms, biases, sinks and router
correction bias are random (transformers leaves ones and zeros), across full layers and a
sliding one (twice the KV heads, sinks, its own RoPE), narrow value heads padded into a wider
cache, a dense MLP and grouped-routed experts; the router stays float32 in bfloat16; the
multi-token-prediction tensors are skipped; what it cannot follow is refused by name."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.distributed.pipeline_parallel import check_pipeline
from compiled_llm.worker.kv_cache import layer_kv_shapes
from compiled_llm.worker.loader import build_model_config, load_hf_config, load_model
from tests.utils import assert_matches_transformers, edited_checkpoint, make_checkpoint


def _biting(key: str, value: torch.Tensor, gen: torch.Generator) -> torch.Tensor | None:
    """Norm weights around 1; biases, sinks and the correction bias drawn."""
    noise = torch.randn(value.shape, generator=gen)
    if key.endswith("norm.weight"):
        return 1 + 0.3 * noise
    if key.endswith((".bias", "attention_sink_bias", "e_score_correction_bias")):
        return 0.5 * noise
    return None


# a multi-token-prediction layer's tensor, as the released checkpoint holds them
MTP = (("model.mtp.layers.0.input_layernorm.weight", torch.ones(64)),)


def biting_checkpoint():
    """make_checkpoint("mimo_v2_flash") with its norms, biases, sinks and router bias drawn,
    and an MTP tensor beside them."""
    return edited_checkpoint("mimo_v2_flash", _biting, seed=9, extra=MTP)


def test_greedy_tokens_and_prompt_logprobs_equal_transformers():
    assert_matches_transformers(biting_checkpoint(), hi=40)


def test_layers_read_the_config():
    _, cfg = build_model_config(load_hf_config(make_checkpoint("mimo_v2_flash")))
    assert [cfg.layer_window(i) for i in range(3)] == [-1, 8, -1]
    assert [cfg.moe.is_sparse(i) for i in range(3)] == [False, True, True]
    assert (cfg.qk_head_dim, cfg.v_head_dim, cfg.head_dim) == (24, 16, 32)
    assert cfg.ropes == ((1e6, 8), (1e4, 12)) and cfg.value_scale == 0.707
    assert layer_kv_shapes(cfg) == [(1, 32), (2, 32), (1, 32)]
    assert (cfg.n_group, cfg.topk_group, cfg.routed_scaling_factor) == (2, 1, 2.0)


def test_sliding_window_size_attends_one_more_token():
    """transformers 5.25 reads the released config's sliding_window_size as a window of it + 1
    (the reference attends that many previous tokens and the query)."""
    hf = {**load_hf_config(make_checkpoint("mimo_v2_flash")), "sliding_window_size": 128}
    assert build_model_config(hf)[1].layer_window(1) == 129


def test_router_stays_float32_in_bfloat16():
    """transformers 5.25 keeps the gate weight and correction bias float32 (strict)."""
    model = load_model(biting_checkpoint(), torch.bfloat16, torch.device("cpu"), 64)
    gate = model.model.layers[1].mlp.gate
    assert gate.weight.dtype == gate.e_score_correction_bias.dtype == torch.float32
    assert model.model.layers[1].self_attn.q_proj.weight.dtype == torch.bfloat16


_FULL_ROPE = {"rope_type": "default", "rope_theta": 1e4}


@pytest.mark.parametrize(("change", "field"), [
    ({"layer_types": ["full_attention", "chunked_attention", "full_attention"]},
     "layer_types"),
    ({"mlp_layer_types": ["dense", "sparse"]}, "mlp_layer_types"),
    ({"sliding_window": None}, "sliding_window"),
    ({"rope_parameters": _FULL_ROPE}, "rope_parameters.full_attention"),
    ({"rope_parameters": {"full_attention": _FULL_ROPE, "sliding_attention": {
        **_FULL_ROPE, "rope_type": "yarn", "factor": 2.0}}}, "rope_parameters.sliding_attention"),
    ({"rope_parameters": {"full_attention": {**_FULL_ROPE, "partial_rotary_factor": 0.3},
                          "sliding_attention": _FULL_ROPE}}, "partial_rotary_factor"),
    ({"num_attention_heads": 2, "num_key_value_heads": 2}, "num_key_value_heads"),
    ({"n_group": 3}, "n_group"),
    ({"topk_group": 3}, "topk_group"),
    ({"num_experts_per_tok": 5}, "num_experts_per_tok"),
    ({"hidden_act": "gelu"}, "hidden_act"),
])
def test_refuses_what_it_cannot_follow(change, field):
    hf = {**load_hf_config(make_checkpoint("mimo_v2_flash")), **change}
    with pytest.raises(ValueError, match=field):
        build_model_config(hf)


def test_pipeline_parallel_is_refused_by_name():
    """(tensor parallelism: tests/distributed/test_tp_more_archs.py)"""
    model_cls, cfg = build_model_config(load_hf_config(make_checkpoint("mimo_v2_flash")))
    with pytest.raises(ValueError, match="pipeline_parallel_size 2: MiMoV2FlashForCausalLM"):
        check_pipeline(model_cls, cfg, 2)
