"""DeepSeek-V2 and -V3 (MLA + shared-expert MoE) against transformers on checkpoints whose norm
weights and e_score_correction_bias are random (transformers saves ones and zeros): V2-Lite's
shape (no q latent, greedy or group-limited softmax routing) and V3's (q latent, YaRN with
mscale_all_dim, grouped sigmoid routing, interleaved or rotate-half RoPE); compiled equals
eager; the options refused by name."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from compiled_llm import LLM
from compiled_llm.worker.loader import build_model_config, load_hf_config, load_model
from tests.utils import (
    CONFIGS,
    EXTRA_CONFIGS,
    assert_matches_transformers,
    edited_checkpoint,
    make_checkpoint,
    random_norms_and_correction_bias,
)

# V2 with greedy routing over every expert, a q latent and no biases; V3 with rotate-half
# RoPE, no q latent, one group, unnormalised weights, every layer sparse
EXTRA_CONFIGS.setdefault("deepseek_v2_greedy", ("DeepseekV2Config", {
    **CONFIGS["deepseek_v2"][1], "topk_method": "greedy", "q_lora_rank": 24,
    "attention_bias": False, "routed_scaling_factor": 1.0}))
EXTRA_CONFIGS.setdefault("deepseek_v3_rotate_half", ("DeepseekV3Config", {
    **CONFIGS["deepseek_v3"][1], "rope_interleave": False, "q_lora_rank": None,
    "n_group": 1, "topk_group": 1, "norm_topk_prob": False, "first_k_dense_replace": 0,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}))
NAMES = ["deepseek_v2", "deepseek_v2_greedy", "deepseek_v3", "deepseek_v3_rotate_half"]




def randomised(name: str) -> Path:
    """make_checkpoint(name) with random norm weights and correction biases, in a new dir."""
    return edited_checkpoint(name, random_norms_and_correction_bias)


@pytest.mark.parametrize("name", NAMES)
def test_greedy_and_prompt_logprobs_match_transformers(name):
    assert_matches_transformers(randomised(name))


def test_padded_head_dim_and_yarn_softmax_scale():
    """q/k heads of 24 and v heads of 16 share a cache head of 32, one per query head; YaRN
    with mscale_all_dim scales the softmax by mscale(4, 1.0) ** 2."""
    _, cfg = build_model_config(load_hf_config(make_checkpoint("deepseek_v3")))
    assert (cfg.head_dim, cfg.num_key_value_heads) == (32, 4)
    mscale = 0.1 * torch.log(torch.tensor(4.0)).item() + 1.0
    assert cfg.softmax_scale == pytest.approx(24**-0.5 * mscale**2)
    model = load_model(randomised("deepseek_v3"), torch.float32, torch.device("cpu"), 64)
    assert model.model.rotary_emb.cos_sin.shape[-1] == 8  # qk_rope_head_dim's table


def test_multi_token_prediction_layer_is_skipped():
    """V3 checkpoints hold an MTP layer at index num_hidden_layers: not ours, skipped."""
    src = randomised("deepseek_v3")
    out = Path(tempfile.mkdtemp(prefix="cllm-deepseek_v3-mtp-"))
    shutil.copytree(src, out, dirs_exist_ok=True)
    path = next(out.glob("*.safetensors"))
    save_file({**load_file(path), "model.layers.3.eh_proj.weight": torch.zeros(64, 128)}, path,
              metadata={"format": "pt"})
    assert len(load_model(out, torch.float32, torch.device("cpu"), 64).model.layers) == 3


@pytest.mark.parametrize(("name", "change", "match"), [
    ("deepseek_v2", {"topk_method": "noaux_tc"}, "topk_method 'noaux_tc' is not supported"),
    ("deepseek_v2", {"num_experts_per_tok": 3}, "num_experts_per_tok 3 is not supported"),
    ("deepseek_v2", {"mlp_bias": True}, "mlp_bias true is not supported"),
    ("deepseek_v3", {"num_key_value_heads": 2}, "num_key_value_heads 2 is not supported"),
    ("deepseek_v3", {"n_shared_experts": 0}, "n_shared_experts 0 is not supported"),
])
def test_options_refused_by_name(name, change, match):
    hf = load_hf_config(make_checkpoint(name))
    with pytest.raises(ValueError, match=match):
        build_model_config({**hf, **change})


@pytest.mark.parametrize("name", ["deepseek_v2", "deepseek_v3"])
def test_tensor_parallel_refuses_uneven_heads_by_name(name):
    """MLA is split by heads (tests/distributed/test_tp_gpt_oss_mla.py): 3 ranks cannot."""
    with pytest.raises(ValueError, match="tensor_parallel_size 3 must divide num_attention"):
        LLM(str(make_checkpoint(name)), dtype="float32", enforce_eager=True,
            engine_core_process=False, tensor_parallel_size=3)
