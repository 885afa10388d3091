"""GPT-Neo, CodeGen, NanoChat, Cohere 2 MoE, Solar Open, Youtu and Mellum: equal to transformers on
checkpoints whose norm weights and biases (routers' correction biases too) are random
(transformers saves ones and zeros, under which a misplaced norm or bias never shows), their
config keys read as transformers reads them, and what the engine refuses by name."""

from __future__ import annotations

import pytest
import torch

from compiled_llm import LLM
from compiled_llm.distributed.pipeline_parallel import check_pipeline
from compiled_llm.models.codegen import CodeGenForCausalLM
from compiled_llm.models.gpt_neo import GPTNeoForCausalLM
from compiled_llm.models.mellum import MellumForCausalLM
from compiled_llm.worker.loader import build_model_config, load_hf_config
from tests.utils import (
    assert_matches_transformers,
    edited_checkpoint,
    engine_config,
    make_checkpoint,
)

NAMES = ["gpt_neo", "codegen", "nanochat", "cohere2_moe", "cohere2_moe_sigmoid", "solar_open",
         "youtu", "mellum"]
ARCHS = {"gpt_neo": "GPTNeoForCausalLM", "codegen": "CodeGenForCausalLM",
         "nanochat": "NanoChatForCausalLM", "youtu": "YoutuForCausalLM"}


def _random_norms_and_biases(key: str, value: torch.Tensor, gen: torch.Generator):
    if "norm" in key or ".ln_" in key or key.endswith((".bias", ".e_score_correction_bias")):
        return value + 0.3 * torch.randn(value.shape, generator=gen)
    return None


@pytest.mark.parametrize("name", NAMES)
def test_random_norms_and_biases_match_transformers(name):
    assert_matches_transformers(edited_checkpoint(name, _random_norms_and_biases), hi=40)


_config = engine_config


def test_gpt_neo_config_keys():
    cfg = _config("gpt_neo")
    assert ([cfg.layer_window(i) for i in range(2)], cfg.intermediate_size) == ([-1, 8], 128)
    cfg = _config("gpt_neo", drop=("window_size", "activation_function", "intermediate_size"),
                  attention_types=[[["local"], 2]], intermediate_size=96)
    assert [cfg.layer_window(i) for i in range(2)] == [256, 256]  # transformers' default
    assert (cfg.hidden_act, cfg.intermediate_size, cfg.tie_word_embeddings) == (
        "gelu_new", 96, True)


@pytest.mark.parametrize(("changes", "match"), [
    ({"attention_types": [[["global", "sparse"], 1]]}, r"attention_types \['sparse'\]"),
    ({"attention_types": [[["global"], 3]]}, "attention_types give 3 layers"),
    ({"window_size": 0}, "window_size 0 is not supported"),
    ({"activation_function": "swiglu"}, "activation_function 'swiglu'")])
def test_gpt_neo_refused_by_name(changes, match):
    with pytest.raises(ValueError, match=match):
        _config("gpt_neo", **changes)


def test_gpt_neo_checkpoint_names():
    """Saved mask buffers skipped; attn.attention.* loads as attn.*; GPTNeoModel names
    (no transformer. prefix) as the body's."""
    assert GPTNeoForCausalLM.weight_name("transformer.h.0.attn.attention.bias") is None
    assert GPTNeoForCausalLM.weight_name("h.1.attn.attention.masked_bias") is None
    assert GPTNeoForCausalLM.weight_name("h.1.attn.attention.out_proj.bias") == (
        "transformer.h.1.attn.out_proj.bias")
    assert CodeGenForCausalLM.weight_name("transformer.h.0.attn.causal_mask") is None
    assert CodeGenForCausalLM.weight_name("h.0.attn.qkv_proj.weight").name == (
        "transformer.h.0.attn.qkv_proj.weight")


def test_codegen_config_keys_and_refusals():
    cfg = _config("codegen", drop=("n_inner",), rotary_dim=16)
    assert (cfg.rotary_dim, cfg.intermediate_size, cfg.head_dim) == (16, 512, 16)
    assert (cfg.tie_word_embeddings, cfg.hidden_act) == (False, "gelu_new")
    with pytest.raises(ValueError, match="n_head 6 is not supported for CodeGenForCausalLM"):
        _config("codegen", n_head=6, n_embd=96)
    with pytest.raises(ValueError, match="rotary_dim None is not supported for CodeGen"):
        _config("codegen", rotary_dim=None)


def test_nanochat_config_keys():
    cfg = _config("nanochat", drop=("final_logit_softcapping", "hidden_act"), mlp_bias=True)
    assert (cfg.final_logit_softcapping, cfg.hidden_act, cfg.mlp_bias) == (15.0, "relu2", False)
    cfg = _config("nanochat", final_logit_softcapping=None, attention_bias=False)
    assert (cfg.final_logit_softcapping, cfg.attention_bias, cfg.o_proj_bias) == (
        None, False, False)
    assert (cfg.num_key_value_heads, cfg.sliding_window) == (2, -1)
    with pytest.raises(ValueError, match="final_logit_softcapping must be a positive number"):
        _config("nanochat", final_logit_softcapping=-1.0)


@pytest.mark.parametrize("name", list(ARCHS))
def test_parallelism_and_lora_refused_by_name(name):
    ckpt, arch = make_checkpoint(name), ARCHS[name]
    with pytest.raises(ValueError, match=f"enable_lora: {arch} has no module"):
        LLM(str(ckpt), enable_lora=True, enforce_eager=True)
    model_cls, cfg = build_model_config(load_hf_config(ckpt))
    if name == "youtu":  # the Llama body's layer loop: two stages split it
        check_pipeline(model_cls, cfg, 2)
        return
    with pytest.raises(ValueError, match=f"pipeline_parallel_size 2: {arch}"):
        check_pipeline(model_cls, cfg, 2)


def test_cohere2_moe_config_keys():
    cfg = _config("cohere2_moe")
    assert (cfg.rope_layers, [cfg.layer_window(i) for i in range(3)]) == ((0, 1), [-1, 8, -1])
    assert (cfg.dense_intermediate_size, cfg.moe.moe_intermediate_size) == (48, 32)
    assert (cfg.moe.mlp_only_layers, cfg.moe.shared_expert_intermediate_size) == ((0,), 32)
    assert (cfg.sigmoid_router, cfg.average_shared, cfg.use_rms_norm) == (False, True, False)
    # force_rope only where prefix_dense_sliding_window_pattern is 1; dense width defaults
    cfg = _config("cohere2_moe", prefix_dense_sliding_window_pattern=2,
                  prefix_dense_intermediate_size=None, num_shared_experts=0)
    assert (cfg.rope_layers, cfg.dense_intermediate_size) == ((1,), 32)
    assert cfg.moe.shared_expert_intermediate_size == 0
    cfg = _config("cohere2_moe_sigmoid", drop=("layer_types", "mlp_layer_types"),
                  first_k_dense_replace=1, num_hidden_layers=3)  # transformers' derivation
    assert (cfg.moe.mlp_only_layers, cfg.rope_layers) == ((0,), (0, 1))
    assert (cfg.sigmoid_router, cfg.average_shared, cfg.rms_norm_eps) == (True, False, 1e-5)


@pytest.mark.parametrize(("changes", "match"), [
    ({"expert_selection_fn": "sparsemixer"}, "expert_selection_fn 'sparsemixer'"),
    ({"shared_expert_combination_strategy": "gated"}, "shared_expert_combination_strategy"),
    ({"mlp_layer_types": ["dense", "moe", "sparse"]}, "mlp_layer_types"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported with mixture-of-experts")])
def test_cohere2_moe_refused_by_name(changes, match):
    with pytest.raises(ValueError, match=match):
        _config("cohere2_moe", **changes)


def test_cohere2_moe_parallelism():
    """Tensor parallelism refused by name where the dense layers' MLP cannot split (its
    runs: tests/distributed/test_tp_more_archs.py), LoRA for MoE models; pipeline stages split
    Cohere's layer loop."""
    from compiled_llm.models.cohere2_moe import Cohere2MoeForCausalLM

    ckpt = make_checkpoint("cohere2_moe")
    with pytest.raises(ValueError, match="size 2 must divide prefix_dense_intermediate_size 49"):
        Cohere2MoeForCausalLM.check_tensor_parallel(
            _config("cohere2_moe", prefix_dense_intermediate_size=49), 2)
    with pytest.raises(ValueError, match="enable_lora: mixture-of-experts"):
        LLM(str(ckpt), enable_lora=True, enforce_eager=True)
    check_pipeline(*build_model_config(load_hf_config(ckpt)), 2)


def test_solar_open_config_keys_and_partial_rotary_refused():
    cfg = _config("solar_open", drop=("rope_parameters",), use_qk_norm=True,
                  first_k_dense_replace=1, intermediate_size=999)  # keys it never reads
    assert (cfg.rope_theta, cfg.use_qk_norm, cfg.moe.mlp_only_layers) == (1e6, False, ())
    assert (cfg.attention_bias, cfg.o_proj_bias, cfg.intermediate_size) == (True, False, 32)
    assert (cfg.n_group, cfg.topk_group, cfg.routed_scaling_factor) == (2, 1, 2.5)
    assert cfg.moe.shared_expert_intermediate_size == 32
    with pytest.raises(ValueError, match="partial_rotary_factor 0.5 is not supported for Solar"):
        _config("solar_open", rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                               "partial_rotary_factor": 0.5})


def test_youtu_config_keys():
    cfg = _config("youtu", drop=("rope_interleave",), n_routed_experts=8, mlp_bias=True)
    assert (cfg.rope_interleave, cfg.moe, cfg.mlp_bias, cfg.head_dim) == (True, None, False, 32)
    cfg = _config("youtu", rope_interleave=False, q_lora_rank=None)
    assert (cfg.rope_interleave, cfg.q_lora_rank) == (False, None)


def test_mellum_config_keys_and_refusals():
    cfg = _config("mellum")
    assert ([cfg.layer_window(i) for i in range(2)], cfg.local_rope_theta) == ([8, -1], 1e4)
    assert (cfg.rope_theta, cfg.rope_scaling["rope_type"], cfg.moe.num_experts) == (
        1e6, "linear", 4)
    assert (cfg.moe.mlp_only_layers, cfg.moe.decoder_sparse_step) == ((0,), 1)
    cfg = _config("mellum", drop=("rope_parameters", "layer_types", "mlp_layer_types"),
                  use_sliding_window=False, mlp_only_layers=[1])  # keys it never reads
    assert ([cfg.layer_window(i) for i in range(2)], cfg.moe.mlp_only_layers) == ([-1, -1], ())
    assert (cfg.rope_theta, cfg.local_rope_theta) == (500000.0, 10000.0)  # its defaults
    rope = {"full_attention": {"rope_type": "default", "rope_theta": 1e6,
                               "partial_rotary_factor": 0.5}}
    with pytest.raises(ValueError, match="partial_rotary_factor 0.5 is not supported"):
        _config("mellum", rope_parameters=rope, layer_types=["full_attention"] * 2)
    with pytest.raises(ValueError, match=r"missing \['sliding_attention'\]"):
        _config("mellum", rope_parameters={"full_attention": {"rope_type": "default"}})
    with pytest.raises(ValueError, match="mlp_layer_types"):
        _config("mellum", mlp_layer_types=["dense"])
    assert MellumForCausalLM.weight_name("mtp.layers.0.mlp.gate.weight") is None
