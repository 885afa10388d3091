"""FlexOlmo, DBRX, PhiMoE, HunYuan MoE and MiniMax-M2 beyond the transformers sweep: random
norm weights, biases and correction biases (transformers saves ones and zeros), tensor-parallel
slices, DBRX's p-norm routing and PhiMoE's sparsemixer against transformers' routers, legacy
config keys (DBRX's rope_theta, MiniMax-M2's rotary_dim), and the options refused by name."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from compiled_llm import LLM
from compiled_llm.distributed.parallel_state import TPGroup
from compiled_llm.models.moe_routing import softmax_topk_pnorm, sparsemixer_top2
from compiled_llm.worker.loader import build_model_config, load_hf_config, load_model
from tests.utils import assert_matches_transformers, edited_checkpoint, make_checkpoint


def _random_norms_and_biases(key: str, value: torch.Tensor, gen: torch.Generator):
    if key.endswith("e_score_correction_bias"):
        return 0.05 * torch.randn(value.shape, generator=gen)
    if key.endswith("norm.weight"):
        return 1.0 + 0.3 * torch.randn(value.shape, generator=gen)
    if key.endswith(".bias"):
        return 0.2 * torch.randn(value.shape, generator=gen)
    return None


@pytest.mark.parametrize("name", ["flex_olmo", "dbrx", "phimoe", "hunyuan_v1_moe", "minimax_m2"])
def test_random_norms_and_biases_match_transformers(name):
    assert_matches_transformers(edited_checkpoint(name, _random_norms_and_biases))


def test_flex_olmo_tensor_parallel_rank_holds_its_rows():
    """Rank 1 of 2: its half of q_norm (OLMo 2's sharded norm) and of each expert's rows."""
    ckpt = make_checkpoint("flex_olmo")
    model = load_model(ckpt, torch.float32, torch.device("cpu"), 64,
                       tp=TPGroup(1, 2, "unused", None, None))
    full = load_file(next(ckpt.glob("*.safetensors")))
    layer, prefix = model.model.layers[1], "model.layers.1"
    assert torch.equal(layer.self_attn.q_norm.weight,
                       full[f"{prefix}.self_attn.q_norm.weight"][32:])
    assert torch.equal(layer.mlp.experts.w2_weight[3],
                       full[f"{prefix}.mlp.experts.3.down_proj.weight"][:, 16:])


@pytest.mark.parametrize("p", [1.0, 2.0, 3.0, None])
def test_softmax_topk_pnorm_matches_transformers_dbrx_router(p):
    from transformers import DbrxConfig
    from transformers.models.dbrx.modeling_dbrx import DbrxFFN

    cfg = DbrxConfig(d_model=64, n_heads=4, n_layers=1, attn_config={"rope_theta": 1e4},
                     ffn_config={"moe_num_experts": 8, "moe_top_k": 3,
                                 "moe_normalize_expert_weights": p})
    logits = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    ref_weights, ref_ids = DbrxFFN(cfg).route_tokens_to_experts(logits)
    weights, ids = softmax_topk_pnorm(logits, 3, p)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_weights)


def test_dbrx_config_keys():
    """DBRX's own config.json (no rope_parameters) gives attn_config's rope_theta; a
    transformers 5 one its rope_parameters; ffn_act_fn with arguments is refused by name."""
    hf = load_hf_config(make_checkpoint("dbrx"))
    _, cfg = build_model_config(hf)
    assert (cfg.rope_theta, cfg.clip_qkv, cfg.moe_normalize_expert_weights) == (5e5, 0.5, 2.0)
    assert (cfg.moe.num_experts, cfg.moe.num_experts_per_tok, cfg.num_key_value_heads) == (4, 2, 2)
    legacy = {key: value for key, value in hf.items() if key != "rope_parameters"}
    assert build_model_config(legacy)[1].rope_theta == 1e4
    ffn = {**hf["ffn_config"], "ffn_act_fn": {"name": "silu", "beta": 2.0}}
    with pytest.raises(ValueError, match="ffn_config.ffn_act_fn"):
        build_model_config({**hf, "ffn_config": ffn})
    ffn = {**hf["ffn_config"], "ffn_act_fn": {"name": "gelu"}}
    with pytest.raises(ValueError, match="hidden_act 'gelu' is not supported with mixture"):
        build_model_config({**hf, "ffn_config": ffn})


@pytest.mark.parametrize(("name", "match"), [
    ("minimax_m2", "tensor_parallel_size 2: MiniMaxM2ForCausalLM's q_norm")])
def test_tensor_parallel_refused_by_name(name, match):
    with pytest.raises(ValueError, match=match):
        LLM(str(make_checkpoint(name)), dtype="float32", enforce_eager=True,
            engine_core_process=False, tensor_parallel_size=2)


def test_minimax_m2_rotary_dim_and_correction_bias():
    """A config.json with rotary_dim alone turns that many dims; the correction bias loads
    from block_sparse_moe into the block."""
    hf = load_hf_config(make_checkpoint("minimax_m2"))
    legacy = {**hf, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}
    assert build_model_config(legacy)[1].rotary_dim == 8
    ckpt = edited_checkpoint("minimax_m2", _random_norms_and_biases)
    model = load_model(ckpt, torch.float32, torch.device("cpu"), 64)
    full = load_file(next(ckpt.glob("*.safetensors")))
    assert torch.equal(model.model.layers[1].mlp.e_score_correction_bias,
                       full["model.layers.1.block_sparse_moe.e_score_correction_bias"])


@pytest.mark.parametrize("jitter_eps", [0.01, 0.3, 2.0])
def test_sparsemixer_matches_transformers(jitter_eps):
    from transformers.models.phimoe.modeling_phimoe import sparsemixer

    logits = torch.randn(16, 8, generator=torch.Generator().manual_seed(2))
    ref_weights, ref_ids = sparsemixer(logits, jitter_eps=jitter_eps, training=False)
    weights, ids = sparsemixer_top2(logits, jitter_eps)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_weights)


def test_phimoe_tensor_parallel_rank_holds_its_rows():
    """Rank 1 of 2: its expert rows, its q/k/v bias rows, its LM head bias rows."""
    ckpt = make_checkpoint("phimoe")
    model = load_model(ckpt, torch.float32, torch.device("cpu"), 64,
                       tp=TPGroup(1, 2, "unused", None, None))
    full = load_file(next(ckpt.glob("*.safetensors")))
    layer, prefix = model.model.layers[0], "model.layers.0"
    gate, _ = layer.mlp.experts.w13_weight[2].chunk(2)
    assert torch.equal(gate, full[f"{prefix}.block_sparse_moe.experts.2.w1.weight"][16:])
    assert torch.equal(layer.self_attn.k_proj.bias, full[f"{prefix}.self_attn.k_proj.bias"][16:])
    vocab = full["lm_head.bias"].shape[0]
    assert torch.equal(model.lm_head.bias, full["lm_head.bias"][vocab // 2:])


@pytest.mark.parametrize(("change", "match"), [
    ({"num_experts_per_tok": 3}, "num_experts_per_tok 3 is not supported"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 2.0, "short_mscale": 1.0,
                          "long_mscale": 1.0}}, "rope_type 'yarn' is not supported for Phimoe"),
    ({"rope_parameters": {"rope_type": "longrope", "short_factor": [1.0] * 8,
                          "long_factor": [1.0] * 8, "short_mscale": 1.0, "long_mscale": 1.5}},
     "short_mscale 1.0 and long_mscale 1.5 must be equal")])
def test_phimoe_options_refused_by_name(change, match):
    hf = load_hf_config(make_checkpoint("phimoe"))
    with pytest.raises(ValueError, match=match):
        build_model_config({**hf, **change})


def test_hunyuan_moe_shared_mlp_router_and_tensor_parallel_rows():
    """shared_mlp loads as the shared expert (rank 1 of 2 holds its rows), the router runs in
    float32 in a bfloat16 model, and a per-layer moe_topk that differs is refused by name."""
    ckpt = make_checkpoint("hunyuan_v1_moe")
    model = load_model(ckpt, torch.float32, torch.device("cpu"), 64,
                       tp=TPGroup(1, 2, "unused", None, None))
    full = load_file(next(ckpt.glob("*.safetensors")))
    block, prefix = model.model.layers[1].mlp, "model.layers.1.mlp"
    assert torch.equal(block.shared_expert.up_proj.weight,
                       full[f"{prefix}.shared_mlp.up_proj.weight"][16:])
    assert torch.equal(block.gate.weight, full[f"{prefix}.gate.wg.weight"])
    assert block.shared_expert_gate is None
    block.gate.to(torch.bfloat16)
    assert block.gate(torch.randn(3, 64, dtype=torch.bfloat16)).dtype == torch.float32
    hf = load_hf_config(ckpt)
    with pytest.raises(ValueError, match=r"moe_topk \[2, 1\] is not supported"):
        build_model_config({**hf, "moe_topk": [2, 1]})
