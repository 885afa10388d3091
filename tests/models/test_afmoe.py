"""AFMoE (Arcee Trinity): equal to transformers on a checkpoint whose norms, biases, router and
expert_bias are random (transformers zeroes the router and expert_bias, so every expert would
tie), across a dense layer, sigmoid-routed expert layers, sliding RoPE and full NoPE layers;
expert_bias stays float32 in a bfloat16 model; what it cannot follow is refused by name."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.distributed.pipeline_parallel import check_pipeline
from compiled_llm.worker.loader import build_model_config, load_hf_config, load_model
from tests.utils import assert_matches_transformers, edited_checkpoint, make_checkpoint


def _biting(key: str, value: torch.Tensor, gen: torch.Generator) -> torch.Tensor | None:
    """Norm weights around 1, biases, the router and expert_bias drawn where transformers
    leaves ones and zeros."""
    noise = torch.randn(value.shape, generator=gen)
    if key.endswith("norm.weight"):
        return 1 + 0.3 * noise
    if key.endswith((".bias", "expert_bias", "router.gate.weight")):
        return 0.5 * noise
    return None


def biting_checkpoint():
    """make_checkpoint("afmoe") with its norms, biases and router drawn."""
    return edited_checkpoint("afmoe", _biting, seed=7)


def test_greedy_tokens_and_prompt_logprobs_equal_transformers():
    assert_matches_transformers(biting_checkpoint(), hi=40)


def test_layers_read_the_config():
    _, cfg = build_model_config(load_hf_config(make_checkpoint("afmoe")))
    assert [cfg.layer_window(i) for i in range(3)] == [8, -1, 8]
    assert [cfg.moe.is_sparse(i) for i in range(3)] == [False, True, True]
    assert cfg.moe.shared_expert_intermediate_size == 32 and cfg.moe.norm_topk_prob
    assert (cfg.route_scale, cfg.mup_enabled, cfg.o_proj_bias) == (2.5, True, True)


def test_layer_types_default_to_every_nth_layer_full():
    hf = {**load_hf_config(make_checkpoint("afmoe")), "global_attn_every_n_layers": 2}
    del hf["layer_types"]
    _, cfg = build_model_config(hf)
    assert [cfg.layer_window(i) for i in range(3)] == [8, -1, 8]


def test_expert_bias_stays_float32_in_bfloat16():
    """transformers 5.25 keeps expert_bias float32 whatever the dtype (_keep_in_fp32_strict)."""
    ckpt = biting_checkpoint()
    model = load_model(ckpt, torch.bfloat16, torch.device("cpu"), 64)
    block = model.model.layers[1].mlp
    assert block.expert_bias.dtype == torch.float32
    assert block.gate.weight.dtype == torch.bfloat16


@pytest.mark.parametrize(("change", "field"), [
    ({"layer_types": ["sliding_attention", "chunked_attention", "full_attention"]},
     "layer_types"),
    ({"layer_types": ["full_attention"] * 2}, "layer_types"),
    ({"sliding_window": None}, "sliding_window"),
    ({"num_dense_layers": None}, "num_dense_layers"),
    ({"num_shared_experts": None}, "num_shared_experts"),
    ({"num_experts_per_tok": 5}, "num_experts_per_tok"),
    ({"route_scale": None}, "route_scale"),
    ({"hidden_act": "gelu"}, "hidden_act"),
])
def test_refuses_what_it_cannot_follow(change, field):
    hf = {**load_hf_config(make_checkpoint("afmoe")), **change}
    with pytest.raises(ValueError, match=field):
        build_model_config(hf)


def test_pipeline_parallel_is_refused_by_name():
    """(tensor parallelism: tests/distributed/test_tp_more_archs.py)"""
    model_cls, cfg = build_model_config(load_hf_config(make_checkpoint("afmoe")))
    with pytest.raises(ValueError, match="pipeline_parallel_size 2: AfmoeForCausalLM"):
        check_pipeline(model_cls, cfg, 2)
