"""Tensor parallelism of GPT-OSS (sinks per head, biased attention, stacked biased experts whose
down bias is added once), of Llama 4 and the Granite MoEs (stacked experts, gate and up
halves; Granite SWA's sinks) and of DeepSeek's MLA (split by heads, latents replicated): each
rank's
parameters are its slices of the checkpoint tensors (one process, no collective), and over gloo
in two processes TP=2 gives TP=1's greedy tokens and prompt logprobs."""

from __future__ import annotations

import functools

import pytest
import torch
from safetensors.torch import load_file

from compiled_llm import LLM, SamplingParams
from compiled_llm.distributed.parallel_state import TPGroup
from compiled_llm.worker.loader import load_model
from tests.utils import edited_checkpoint, random_prompts

BITING = ("sinks", "bias", "router.weight")  # transformers saves biases of 0


def _biting(key: str, value: torch.Tensor, gen: torch.Generator) -> torch.Tensor | None:
    if key.endswith("e_score_correction_bias"):
        return torch.randn(value.shape, generator=gen) * 0.05
    if key.endswith("norm.weight"):
        return 1.0 + torch.randn(value.shape, generator=gen) * 0.2
    return torch.randn(value.shape, generator=gen) if any(p in key for p in BITING) else None


@functools.cache
def _checkpoint(name: str):
    """make_checkpoint(name) with random sinks, biases, routers, norms and correction biases."""
    return edited_checkpoint(name, _biting, seed=11)


def _load(name: str, rank: int, dtype=torch.float32, expert_parallel: bool = False):
    ckpt = _checkpoint(name)
    tp = TPGroup(rank, 2, "unused", None, None)  # loading runs no collective
    model = load_model(ckpt, dtype, torch.device("cpu"), 128, tp=tp,
                       expert_parallel=expert_parallel)
    full = {}
    for path in ckpt.glob("*.safetensors"):
        full.update(load_file(path))
    return model, full


def _part(tensor: torch.Tensor, dim: int, rank: int, size: int) -> torch.Tensor:
    return tensor.narrow(dim, rank * size, size)


@pytest.mark.parametrize("rank", [0, 1])
def test_gpt_oss_rank_holds_its_heads_and_expert_rows(rank):
    model, full = _load("gpt_oss", rank)
    layer, at = model.model.layers[0], "model.layers.0"
    attn, mlp = layer.self_attn, layer.mlp
    assert torch.equal(attn.sinks, _part(full[f"{at}.self_attn.sinks"], 0, rank, 2))
    assert torch.equal(attn.q_proj.bias, _part(full[f"{at}.self_attn.q_proj.bias"], 0, rank, 32))
    assert torch.equal(attn.o_proj.bias, full[f"{at}.self_attn.o_proj.bias"])  # added once
    assert torch.equal(mlp.router.weight, full[f"{at}.mlp.router.weight"])  # replicated
    assert type(mlp).__name__ == "ReducedGptOssMoE"
    experts, size = mlp.experts, 16  # intermediate 32 over 2 ranks
    gate_up = full[f"{at}.mlp.experts.gate_up_proj"]  # [E, H, 2I], gate / up interleaved
    gate, up = experts.w13_weight.transpose(1, 2).split(size, -1)
    assert torch.equal(gate, _part(gate_up[..., 0::2], 2, rank, size))
    assert torch.equal(up, _part(gate_up[..., 1::2], 2, rank, size))
    bias = full[f"{at}.mlp.experts.gate_up_proj_bias"]
    assert torch.equal(experts.w13_bias, torch.cat([_part(bias[:, 0::2], 1, rank, size),
                                                    _part(bias[:, 1::2], 1, rank, size)], -1))
    down = full[f"{at}.mlp.experts.down_proj"]  # [E, I, H]
    assert torch.equal(experts.w2_weight, _part(down, 1, rank, size).transpose(1, 2))
    down_bias = full[f"{at}.mlp.experts.down_proj_bias"]  # rank 0's alone: summed once
    assert torch.equal(experts.w2_bias, down_bias if rank == 0 else torch.zeros_like(down_bias))
    assert experts.intermediate_size == size


def test_gpt_oss_expert_parallel_holds_whole_experts_with_their_biases():
    model, full = _load("gpt_oss", 1, expert_parallel=True)
    experts, at = model.model.layers[1].mlp.experts, "model.layers.1.mlp.experts"
    gate_up = full[f"{at}.gate_up_proj"][2:]  # experts 2 and 3 of 4
    assert torch.equal(experts.w13_weight.transpose(1, 2),
                       torch.cat([gate_up[..., 0::2], gate_up[..., 1::2]], -1))
    assert torch.equal(experts.w2_weight, full[f"{at}.down_proj"][2:].transpose(1, 2))
    assert torch.equal(experts.w2_bias, full[f"{at}.down_proj_bias"][2:])  # its own experts'
    assert experts.dispatcher.expert_start == 2


@pytest.mark.parametrize("rank", [0, 1])
def test_llama4_rank_holds_its_expert_columns(rank):
    """Of the stacked gate_up_proj [E, H, 2I], this rank's gate columns then its up columns;
    of down_proj [E, I, H], its rows; the shared expert and the dense MLP by rows too."""
    model, full = _load("llama4", rank)
    moe, at = model.model.layers[1].feed_forward, "model.layers.1.feed_forward"
    gate, up = full[f"{at}.experts.gate_up_proj"].chunk(2, -1)  # I = 48: 24 a rank
    assert torch.equal(moe.experts.w13_weight.transpose(1, 2),
                       torch.cat([_part(gate, 2, rank, 24), _part(up, 2, rank, 24)], -1))
    assert torch.equal(moe.experts.w2_weight,
                       _part(full[f"{at}.experts.down_proj"], 1, rank, 24).transpose(1, 2))
    assert torch.equal(moe.shared_expert.down_proj.weight,
                       _part(full[f"{at}.shared_expert.down_proj.weight"], 1, rank, 24))
    assert torch.equal(moe.router.weight, full[f"{at}.router.weight"])
    dense = model.model.layers[0].feed_forward
    assert torch.equal(dense.down_proj.weight,
                       _part(full["model.layers.0.feed_forward.down_proj.weight"], 1, rank, 64))


@pytest.mark.parametrize("name", ["deepseek_v2", "deepseek_v3"])
def test_mla_rank_holds_its_heads(name):
    """Rank 1 of 2: heads 2 and 3 of q (q_b_proj or q_proj), kv_b_proj and o_proj; the latent
    projections, their norms and the float32 router (a bfloat16 model) whole."""
    model, full = _load(name, 1, torch.bfloat16)
    attn, at = model.model.layers[1].self_attn, "model.layers.1.self_attn"
    q_name = "q_b_proj" if name == "deepseek_v3" else "q_proj"
    bf16 = {key: value.to(torch.bfloat16) for key, value in full.items()}
    assert torch.equal(getattr(attn, q_name).weight,
                       _part(bf16[f"{at}.{q_name}.weight"], 0, 1, 2 * 24))  # 16 + 8 dims
    assert torch.equal(attn.kv_b_proj.weight,
                       _part(bf16[f"{at}.kv_b_proj.weight"], 0, 1, 2 * 32))  # 16 + 16 dims
    assert torch.equal(attn.o_proj.weight, _part(bf16[f"{at}.o_proj.weight"], 1, 1, 2 * 16))
    for whole in ("kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight"):
        assert torch.equal(attn.get_submodule(whole.rpartition(".")[0]).weight,
                           bf16[f"{at}.{whole}"])
    assert attn.num_heads == 2 and model.config.num_key_value_heads == 2  # this rank's cache
    gate = model.model.layers[1].mlp.gate
    assert gate.weight.dtype == torch.float32
    assert torch.equal(gate.weight, full["model.layers.1.mlp.gate.weight"])
    if name == "deepseek_v3":
        assert torch.equal(gate.e_score_correction_bias,
                           full["model.layers.1.mlp.gate.e_score_correction_bias"])


def _tp1_and_tp2(name: str, **kw) -> list:
    """(TP=1's, TP=2's) outputs: greedy tokens and prompt logprobs on three prompts; a name
    ending in _ep runs TP=2 with whole experts per rank (enable_expert_parallel)."""
    ckpt = _checkpoint(name.removesuffix("_ep"))
    extra = {"enable_expert_parallel": True} if name.endswith("_ep") else {}
    prompts = [{"prompt_token_ids": p} for p in random_prompts(3, 300, lo=3, hi=40, seed=5)]
    params = SamplingParams(temperature=0.0, max_tokens=6, prompt_logprobs=1)
    runs = []
    for tp in (1, 2):
        llm = LLM(str(ckpt), tensor_parallel_size=tp, dtype="float32", max_model_len=128,
                  engine_core_process=False, **kw, **(extra if tp > 1 else {}))
        try:
            assert tp == 1 or llm.engine.executor.tp.world_size == 2
            runs.append(llm.generate(prompts, params, use_tqdm=False))
        finally:
            llm.shutdown()
    return runs


def _assert_equal(runs: list, atol: float) -> None:
    for one, two in zip(*runs, strict=True):
        assert one.outputs[0].token_ids == two.outputs[0].token_ids
        for a, b in zip(one.prompt_logprobs[1:], two.prompt_logprobs[1:], strict=True):
            token = next(iter(a))
            assert a[token].logprob == pytest.approx(b[token].logprob, abs=atol)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt_oss", "gpt_oss_ep", "deepseek_v3", "deepseek_v2",
                                  "glm4_moe_lite", "minicpm3", "youtu", "llama4", "llama4_ep",
                                  "llama4_vl", "granitemoeshared", "granitemoeshared_ep",
                                  "granite_swa", "granitemoe_swa"])
def test_tp2_equals_tp1(name):
    _assert_equal(_tp1_and_tp2(name, enforce_eager=True, kv_cache_memory_bytes=4 << 20), 1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("name", ["gpt_oss", "gpt_oss_ep", "deepseek_v3"])
def test_tp2_compiled_on_two_gpus_equals_tp1(name):
    """Compiled, CUDA graphs captured on every rank, NCCL."""
    _assert_equal(_tp1_and_tp2(name, gpu_memory_utilization=0.3), 1e-3)
