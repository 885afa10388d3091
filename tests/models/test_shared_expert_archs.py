"""GLM-4.5 (Glm4Moe), dots.llm1 (Dots1), GraniteMoeShared and ERNIE 4.5 MoE against
transformers beyond the sweep: a nonzero e_score_correction_bias (transformers saves zeros),
GLM-4.5 and ERNIE without their options, multi-token-prediction tensors skipped,
tensor-parallel slices of the shared expert, and the options refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from compiled_llm import LLM
from compiled_llm.distributed.parallel_state import TPGroup
from compiled_llm.worker.loader import build_model_config, load_hf_config, load_model
from tests.utils import (
    CONFIGS,
    EXTRA_CONFIGS,
    assert_matches_transformers,
    edited_checkpoint,
    make_checkpoint,
)

# GLM-4.5 without its options: no q/k norms, no biases, one group, every layer sparse,
# unnormalised weights, a quarter of each head turned
EXTRA_CONFIGS.setdefault("glm4_moe_plain", ("Glm4MoeConfig", {
    **CONFIGS["glm4_moe"][1], "use_qk_norm": False, "attention_bias": False, "n_group": 1,
    "first_k_dense_replace": 0, "norm_topk_prob": False, "routed_scaling_factor": 1.0,
    "partial_rotary_factor": 0.25}))


def _random_correction_bias(key: str, value: torch.Tensor, gen: torch.Generator):
    if key.endswith("e_score_correction_bias"):
        return torch.randn(value.shape, generator=gen) * 0.05
    return None


def with_correction_bias(name: str, extra: tuple = ()) -> Path:
    """make_checkpoint(name) with a random e_score_correction_bias on every router (and the
    tensors of `extra` added)."""
    return edited_checkpoint(name, _random_correction_bias, seed=3, extra=extra)


CASES = [("glm4_moe", True), ("dots1", True), ("glm4_moe_plain", True),
         ("granitemoeshared", False), ("ernie4_5_moe", True), ("ernie4_5_moe_plain", True)]


def _checkpoint(name: str, biased: bool) -> Path:
    return with_correction_bias(name) if biased else make_checkpoint(name)


@pytest.mark.parametrize(("name", "biased"), CASES)
def test_greedy_and_prompt_logprobs_match_transformers(name, biased):
    assert_matches_transformers(_checkpoint(name, biased))


def test_correction_bias_changes_the_routing():
    """The biased checkpoint's router picks other experts than the plain one's."""
    plain = load_model(make_checkpoint("dots1"), torch.float32, torch.device("cpu"), 64)
    biased = load_model(with_correction_bias("dots1"), torch.float32, torch.device("cpu"), 64)
    hidden = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    ids = [m.model.layers[1].mlp.route(m.model.layers[1].mlp.gate(hidden))[1].sort(-1).values
           for m in (plain, biased)]
    assert not torch.equal(*ids)


def test_ernie_sparse_layers_and_mtp_tensors():
    """moe_layer_start_index / interval pick the sparse layers; `mtp` tensors are skipped."""
    _, cfg = build_model_config(load_hf_config(make_checkpoint("ernie4_5_moe_plain")))
    assert [cfg.moe.is_sparse(i) for i in range(3)] == [False, True, False]
    extra = (("model.mtp_linear_proj.0.weight", torch.zeros(64, 128)),)
    model = load_model(with_correction_bias("ernie4_5_moe", extra), torch.float32,
                       torch.device("cpu"), 64)
    assert model.lm_head.bias is not None and model.lm_head.weight is (
        model.model.embed_tokens.weight)


def test_multi_token_prediction_layer_is_skipped():
    """GLM-4.5 checkpoints hold an MTP layer at index num_hidden_layers: not ours, skipped."""
    extra = (("model.layers.3.eh_proj.weight", torch.zeros(64, 128)),
             ("model.layers.3.mlp.experts.0.gate_proj.weight", torch.zeros(32, 64)))
    model = load_model(with_correction_bias("glm4_moe", extra), torch.float32,
                       torch.device("cpu"), 64)
    assert len(model.model.layers) == 3


@pytest.mark.parametrize("rank", [0, 1])
def test_tensor_parallel_rank_holds_its_expert_and_shared_rows(rank):
    ckpt = make_checkpoint("glm4_moe")
    model = load_model(ckpt, torch.float32, torch.device("cpu"), 64,
                       tp=TPGroup(rank, 2, "unused", None, None))
    full = {}
    for path in ckpt.glob("*.safetensors"):
        full.update(load_file(path))
    block, prefix = model.model.layers[1].mlp, "model.layers.1.mlp"
    routed, shared = 32 // 2, 64 // 2  # moe_intermediate_size, 2 shared experts' width
    gate, up = block.experts.w13_weight[5].chunk(2)
    assert torch.equal(gate, full[f"{prefix}.experts.5.gate_proj.weight"][
        rank * routed:(rank + 1) * routed])
    assert torch.equal(up, full[f"{prefix}.experts.5.up_proj.weight"][
        rank * routed:(rank + 1) * routed])
    assert torch.equal(block.shared_expert.down_proj.weight, full[
        f"{prefix}.shared_experts.down_proj.weight"][:, rank * shared:(rank + 1) * shared])
    assert torch.equal(block.gate.weight, full[f"{prefix}.gate.weight"])  # replicated
    assert type(block).__name__ == "ReducedGroupedTopkMoeBlock"


def test_ernie_tensor_parallel_rank_holds_its_expert_rows():
    """Without use_bias ERNIE 4.5 MoE shards as Qwen2-MoE: expert rows split, router whole."""
    ckpt = make_checkpoint("ernie4_5_moe_plain")
    model = load_model(ckpt, torch.float32, torch.device("cpu"), 64,
                       tp=TPGroup(1, 2, "unused", None, None))
    full = {}
    for path in ckpt.glob("*.safetensors"):
        full.update(load_file(path))
    block, prefix = model.model.layers[1].mlp, "model.layers.1.mlp"
    assert torch.equal(block.experts.w2_weight[2],
                       full[f"{prefix}.experts.2.down_proj.weight"][:, 16:])
    assert torch.equal(block.gate.e_score_correction_bias,
                       full[f"{prefix}.moe_statics.e_score_correction_bias"])
    assert type(block).__name__ == "ReducedErnie4_5_MoeBlock"


@pytest.mark.parametrize(("name", "change", "match"), [
    ("glm4_moe", {"n_shared_experts": 0}, "n_shared_experts 0 is not supported"),
    ("dots1", {"n_group": 3}, "n_group 3 / topk_group 2 is not supported"),
    ("dots1", {"topk_group": 5}, "n_group 4 / topk_group 5 is not supported"),
    ("glm4_moe", {"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported with mixture"),
])
def test_options_refused_by_name(name, change, match):
    hf = load_hf_config(make_checkpoint(name))
    with pytest.raises(ValueError, match=match):
        build_model_config({**hf, **change})


@pytest.mark.parametrize(("name", "match"), [
    ("ernie4_5_moe", "Ernie4_5_MoeForCausalLM with use_bias")])
def test_tensor_parallel_refused_by_name(name, match):
    with pytest.raises(ValueError, match=match):
        LLM(str(make_checkpoint(name)), dtype="float32", enforce_eager=True,
            engine_core_process=False, tensor_parallel_size=2)


def test_granitemoeshared_without_shared_mlp_is_granitemoe():
    hf = load_hf_config(make_checkpoint("granitemoeshared"))
    _, cfg = build_model_config({**hf, "shared_intermediate_size": 0})
    assert cfg.moe.shared_expert_intermediate_size == 0
