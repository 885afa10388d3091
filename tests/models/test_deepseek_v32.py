"""DeepSeek-V3.2 (DeepseekV32ForCausalLM) and GLM-5 (GlmMoeDsaForCausalLM) against transformers on
checkpoints whose norm weights and correction biases are random: within index_topk tokens
DeepSeek Sparse Attention keeps every causally visible key (plain causal MLA), so the indexer's
tensors load skipped; max_model_len is capped at index_topk and refused past it by name; the
config fallbacks and the options refused by name."""

from __future__ import annotations

import pytest

from compiled_llm import LLM
from compiled_llm.config import EngineArgs, model_len_bounds
from compiled_llm.worker.loader import build_model_config, load_hf_config
from tests.models.test_deepseek_archs import randomised
from tests.utils import assert_matches_transformers, make_checkpoint

NAMES = ["deepseek_v32", "glm_moe_dsa"]


@pytest.mark.parametrize("name", NAMES)
def test_greedy_and_prompt_logprobs_match_transformers(name):
    # prompts and outputs of up to 66 tokens, under index_topk 96: the whole causal window
    assert_matches_transformers(randomised(name))


@pytest.mark.parametrize("name", NAMES)
def test_max_model_len_capped_at_index_topk(name):
    hf = load_hf_config(make_checkpoint(name))
    assert model_len_bounds(hf) == (96, 96)  # YaRN's 128 positions, capped at index_topk
    args = EngineArgs(model=str(make_checkpoint(name)))
    assert args.scheduler_config(*model_len_bounds(hf)).max_model_len == 96
    with pytest.raises(ValueError, match="max_model_len 100 exceeds.*index_topk"):
        LLM(str(make_checkpoint(name)), enforce_eager=True, dtype="float32",
            max_model_len=100)
    model_cls, cfg = build_model_config(hf)
    with pytest.raises(ValueError, match="max_model_len 100 exceeds index_topk 96"):
        model_cls(cfg, 100)
    # transformers' index_topk of 2048 where config.json leaves it out; other models: no cap
    long = {**hf, "max_position_embeddings": 8192, "rope_parameters": None}
    assert model_len_bounds({k: v for k, v in long.items() if k != "index_topk"})[0] == 2048
    assert model_len_bounds({**long, "model_type": "deepseek_v3"})[0] == 8192


def test_config_fallbacks():
    """Without mlp_layer_types the first first_k_dense_replace layers are dense; RoPE turns
    interleaved pairs whatever rope_interleave says (transformers never reads it)."""
    hf = load_hf_config(make_checkpoint("deepseek_v32"))
    _, cfg = build_model_config({**hf, "mlp_layer_types": None, "first_k_dense_replace": 2,
                                 "rope_interleave": False})
    assert cfg.moe.mlp_only_layers == (0, 1) and cfg.rope_interleave
    assert (cfg.index_topk, cfg.head_dim) == (96, 32)


@pytest.mark.parametrize(("name", "change", "match"), [
    ("deepseek_v32", {"q_lora_rank": None}, "q_lora_rank null is not supported"),
    ("glm_moe_dsa", {"index_topk": 0}, "index_topk 0 is not supported"),
    ("deepseek_v32", {"index_topk": None}, "index_topk None is not supported"),
    ("glm_moe_dsa", {"num_key_value_heads": 2}, "num_key_value_heads 2 is not supported"),
    ("deepseek_v32", {"mlp_layer_types": ["dense", "moe", "sparse"]}, "mlp_layer_types"),
])
def test_options_refused_by_name(name, change, match):
    hf = load_hf_config(make_checkpoint(name))
    with pytest.raises(ValueError, match=match):
        build_model_config({**hf, **change})
