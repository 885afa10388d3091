"""LongCat-Flash: equal to transformers on checkpoints whose norms and router correction bias
are random (transformers leaves ones and zeros), and on ones whose bias forces the zero
experts into every token's top-k, or keeps them out; two attentions a layer on four cache
layers; the router stays float32 in bfloat16; MTP tensors and the zero experts' stacked rows
(transformers 5.17's) are skipped; what it cannot follow is refused by name."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.distributed.pipeline_parallel import check_pipeline
from compiled_llm.worker.kv_cache import layer_kv_shapes
from compiled_llm.worker.loader import build_model_config, load_hf_config, load_model
from tests.utils import assert_matches_transformers, edited_checkpoint, make_checkpoint

NAME = "longcat_flash"


def _biting(key: str, value: torch.Tensor, gen: torch.Generator) -> torch.Tensor | None:
    """Norm weights around 1, the correction bias drawn (ties would hide a misread bias)."""
    noise = torch.randn(value.shape, generator=gen)
    if key.endswith("norm.weight"):
        return 1 + 0.3 * noise
    if key.endswith("e_score_correction_bias"):
        return 0.1 * noise
    return None


def _zero_bias(shift: float):
    """_biting, then `shift` added to the two zero experts' correction bias."""
    def edit(key: str, value: torch.Tensor, gen: torch.Generator) -> torch.Tensor | None:
        edited = _biting(key, value, gen)
        if key.endswith("e_score_correction_bias"):
            edited[4:] += shift
        return edited
    return edit


_ZERO_FIRST, _ZERO_NEVER = _zero_bias(1.0), _zero_bias(-1.0)


def test_greedy_tokens_and_prompt_logprobs_equal_transformers():
    assert_matches_transformers(edited_checkpoint(NAME, _biting, seed=9), hi=40)


@pytest.mark.parametrize("edit", [_ZERO_FIRST, _ZERO_NEVER], ids=["zero_first", "zero_never"])
def test_zero_experts_chosen_always_or_never_equal_transformers(edit):
    assert_matches_transformers(edited_checkpoint(NAME, edit, seed=4), new_tokens=6, hi=20)


def test_two_attentions_a_layer_have_their_own_caches():
    model_cls, cfg = build_model_config(load_hf_config(make_checkpoint(NAME)))
    assert (cfg.num_layers, cfg.num_hidden_layers, cfg.head_dim) == (2, 4, 32)
    assert layer_kv_shapes(cfg) == [(4, 32)] * 4
    assert [cfg.moe.is_sparse(i) for i in range(4)] == [False, True, False, True]
    assert (cfg.zero_expert_num, cfg.routed_scaling_factor) == (2, 1.5)
    model = model_cls(cfg, max_len=64)
    assert [attn.layer_idx for layer in model.model.layers for attn in layer.self_attn] == [
        0, 1, 2, 3]


# a multi-token-prediction tensor, and transformers 5.17's gate/up rows of a zero expert
_SKIPPED = (("model.mtp.layers.0.input_layernorm.weight", torch.ones(64)),
            ("model.layers.0.mlp.experts.4.gate_proj.weight", torch.ones(32, 64)),
            ("model.layers.1.mlp.experts.5.up_proj.weight", torch.ones(32, 64)))


def test_router_stays_float32_and_unread_tensors_are_skipped():
    """transformers keeps the classifier float32; the correction bias is read in float32."""
    ckpt = edited_checkpoint(NAME, _biting, seed=9, extra=_SKIPPED)
    model = load_model(ckpt, torch.bfloat16, torch.device("cpu"), 64)
    router = model.model.layers[1].mlp.router
    assert router.classifier.weight.dtype == torch.float32
    assert router.e_score_correction_bias.dtype == torch.float32
    assert router.e_score_correction_bias.abs().sum() > 0
    assert model.model.layers[1].self_attn[1].q_b_proj.weight.dtype == torch.bfloat16


@pytest.mark.parametrize(("change", "field"), [
    ({"zero_expert_type": "zero"}, "zero_expert_type"),
    ({"router_bias": True}, "router_bias"),
    ({"mla_scale_q_lora": False}, "mla_scale_q_lora"),
    ({"mla_scale_kv_lora": False}, "mla_scale_kv_lora"),
    ({"attention_method": "MHA"}, "attention_method"),
    ({"moe_intermediate_size": 32}, "moe_intermediate_size"),
    ({"num_experts_per_tok": 2}, "num_experts_per_tok"),
    ({"num_hidden_layers": 2}, "num_hidden_layers"),
    ({"q_lora_rank": None}, "q_lora_rank"),
    ({"head_dim": 16}, "head_dim"),
    ({"qk_head_dim": 32}, "qk_head_dim"),
    ({"moe_topk": 7}, "moe_topk"),
    ({"n_routed_experts": 0}, "n_routed_experts"),
    ({"num_key_value_heads": 2}, "num_key_value_heads"),
    ({"hidden_act": "gelu"}, "hidden_act"),
])
def test_refuses_what_it_cannot_follow(change, field):
    hf = {**load_hf_config(make_checkpoint(NAME)), **change}
    with pytest.raises(ValueError, match=field):
        build_model_config(hf)


def test_pipeline_parallel_is_refused_by_name():
    """(tensor parallelism: tests/distributed/test_tp_more_archs.py)"""
    model_cls, cfg = build_model_config(load_hf_config(make_checkpoint(NAME)))
    with pytest.raises(ValueError, match="pipeline_parallel_size 2: LongcatFlashForCausalLM"):
        check_pipeline(model_cls, cfg, 2)
