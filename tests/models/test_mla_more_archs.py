"""GLM-4.7-Flash (Glm4MoeLite) and MiniCPM3, the MLA architectures beyond DeepSeek's, and
K-EXAONE (ExaoneMoe, the same MoE block under EXAONE 4.0's attention) against transformers on
checkpoints whose norm weights and correction biases are random: GLM's with a q latent,
interleaved RoPE and YaRN, or no q latent and rotate-half RoPE; MiniCPM3's LongRoPE and
scalars; their config fallbacks and the options refused by name."""

from __future__ import annotations

import math
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from compiled_llm import LLM
from compiled_llm.worker.loader import build_model_config, load_hf_config, load_model
from tests.models.test_deepseek_archs import randomised
from tests.utils import EXTRA_CONFIGS, assert_matches_transformers, make_checkpoint

# no q latent (q_proj), rotate-half RoPE without scaling, dense layers as transformers'
# default has them (the first alone), unnormalised weights, no biases
EXTRA_CONFIGS.setdefault("glm4_moe_lite_plain", ("Glm4MoeLiteConfig", {
    **EXTRA_CONFIGS["glm4_moe_lite"][1], "q_lora_rank": None, "rope_interleave": False,
    "mlp_layer_types": None, "norm_topk_prob": False, "attention_bias": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}))


@pytest.mark.parametrize("name", ["glm4_moe_lite", "glm4_moe_lite_plain", "minicpm3",
                                  "exaone_moe"])
def test_greedy_and_prompt_logprobs_match_transformers(name):
    assert_matches_transformers(randomised(name))


def test_config_fallbacks():
    """GLM: the first layer alone dense without mlp_layer_types (first_k_dense_replace is
    never read); MiniCPM3: null scale_depth / dim_model_base / v_head_dim scale nothing and
    give hidden_size / num_attention_heads v heads; the rope table spans qk_rope_head_dim."""
    glm = load_hf_config(make_checkpoint("glm4_moe_lite"))
    _, cfg = build_model_config({**glm, "mlp_layer_types": None, "first_k_dense_replace": 2})
    assert cfg.moe.mlp_only_layers == (0,) and cfg.head_dim == 32
    cpm = load_hf_config(make_checkpoint("minicpm3"))
    _, cfg = build_model_config(cpm)
    assert cfg.residual_multiplier == pytest.approx(1.6 / math.sqrt(2))
    assert (cfg.embedding_multiplier, cfg.logits_scaling, cfg.rope_interleave) == (3.0, 4.0, False)
    _, cfg = build_model_config({**cpm, "scale_depth": None, "dim_model_base": None,
                                 "v_head_dim": None})
    assert (cfg.residual_multiplier, cfg.logits_scaling, cfg.v_head_dim) == (1.0, 1.0, 16)


def test_exaone_moe_mtp_tensors_are_skipped():
    """K-EXAONE checkpoints hold a multi-token-prediction module (mtp.*): not ours, skipped."""
    out = Path(tempfile.mkdtemp(prefix="cllm-exaone_moe-mtp-"))
    shutil.copytree(randomised("exaone_moe"), out, dirs_exist_ok=True)
    path = next(out.glob("*.safetensors"))
    save_file({**load_file(path), "mtp.layers.0.eh_proj.weight": torch.zeros(64, 128)}, path,
              metadata={"format": "pt"})
    assert len(load_model(out, torch.float32, torch.device("cpu"), 64).model.layers) == 4


@pytest.mark.parametrize(("name", "change", "match"), [
    ("glm4_moe_lite", {"mlp_layer_types": ["dense", "moe", "sparse"]}, "mlp_layer_types"),
    ("glm4_moe_lite", {"mlp_layer_types": ["dense", "sparse"]}, "mlp_layer_types"),
    ("glm4_moe_lite_plain", {"partial_rotary_factor": 0.5}, "partial_rotary_factor 0.5"),
    ("glm4_moe_lite", {"num_key_value_heads": 2}, "num_key_value_heads 2 is not supported"),
    ("minicpm3", {"num_key_value_heads": 2}, "num_key_value_heads 2 is not supported"),
    ("minicpm3", {"rope_parameters": {"rope_type": "longrope", "short_factor": [1.0] * 3,
                                      "long_factor": [1.0] * 3}}, "short_factor"),
    ("exaone_moe", {"num_shared_experts": 0}, "num_shared_experts 0 is not supported"),
    ("exaone_moe", {"mlp_layer_types": ["dense"] * 3}, "mlp_layer_types"),
])
def test_options_refused_by_name(name, change, match):
    hf = load_hf_config(make_checkpoint(name))
    with pytest.raises(ValueError, match=match):
        build_model_config({**hf, **change})


@pytest.mark.parametrize("name", ["glm4_moe_lite", "minicpm3"])
def test_tensor_parallel_refuses_uneven_heads_by_name(name):
    """MLA is split by heads (tests/distributed/test_tp_gpt_oss_mla.py): 3 ranks cannot."""
    with pytest.raises(ValueError, match="tensor_parallel_size 3 must divide num_attention"):
        LLM(str(make_checkpoint(name)), dtype="float32", enforce_eager=True,
            engine_core_process=False, tensor_parallel_size=3)
