"""GPT-OSS: equal to transformers on a checkpoint whose expert biases, router and sinks are
random and large enough to bite (transformers zeroes the expert biases), across sliding and full
layers; its stacked, interleaved expert tensors land in w13/w2 in the fused op's order."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from compiled_llm import LLM, SamplingParams
from compiled_llm.worker.loader import build_model_config, load_hf_config
from tests.utils import (
    assert_matches_transformers,
    edited_checkpoint,
    make_checkpoint,
    random_prompts,
)

BITING = ("sinks", "bias", "router.weight")


def _biting(key: str, value: torch.Tensor, gen: torch.Generator) -> torch.Tensor | None:
    return torch.randn(value.shape, generator=gen) if any(p in key for p in BITING) else None


def biting_checkpoint():
    """make_checkpoint("gpt_oss") with its sinks, biases and router drawn at scale 1."""
    return edited_checkpoint("gpt_oss", _biting, seed=11)


def test_greedy_tokens_and_prompt_logprobs_equal_transformers():
    assert_matches_transformers(biting_checkpoint(), hi=40)


def test_compiled_equals_eager():
    ckpt = biting_checkpoint()
    prompts = random_prompts(4, 300, lo=10, hi=30, seed=4)
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    results = []
    for eager in (True, False):
        llm = LLM(str(ckpt), enforce_eager=eager, dtype="float32")
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        results.append([o.outputs[0].token_ids for o in outs])
        llm.shutdown()
    assert results[0] == results[1]


def test_config_reads_transformers_defaults():
    hf = load_hf_config(make_checkpoint("gpt_oss"))
    for key in ("layer_types", "rope_parameters", "rope_scaling", "swiglu_limit"):
        hf.pop(key, None)
    _, cfg = build_model_config(hf)
    assert cfg.rope_scaling["rope_type"] == "yarn" and cfg.rope_scaling["factor"] == 32.0
    assert [cfg.layer_window(i) for i in range(2)] == [8, -1]  # even layers slide
    assert (cfg.swiglu_alpha, cfg.swiglu_limit) == (1.702, 7.0)
    assert cfg.moe.num_experts == 4 and cfg.moe.moe_intermediate_size == 32


def test_interleaved_expert_tensors_load_in_the_fused_order():
    ckpt = biting_checkpoint()
    weights = load_file(next(ckpt.glob("*.safetensors")))
    llm = LLM(str(ckpt), enforce_eager=True, dtype="float32")
    experts = llm.engine.executor.worker.runner.model.model.layers[0].mlp.experts
    gate_up = weights["model.layers.0.mlp.experts.gate_up_proj"]  # [E, H, 2I] interleaved
    torch.testing.assert_close(experts.w13_weight[:, :32], gate_up[..., 0::2].transpose(1, 2))
    torch.testing.assert_close(experts.w13_weight[:, 32:], gate_up[..., 1::2].transpose(1, 2))
    bias = weights["model.layers.0.mlp.experts.gate_up_proj_bias"]
    torch.testing.assert_close(experts.w13_bias, torch.cat([bias[:, 0::2], bias[:, 1::2]], -1))
    llm.shutdown()


def test_tensor_parallel_refuses_uneven_heads_by_name():
    """Sharded by heads and expert rows (tests/distributed/test_tp_gpt_oss_mla.py): 3 ranks
    cannot split 4 heads."""
    with pytest.raises(ValueError, match="tensor_parallel_size 3 must divide num_attention"):
        LLM(str(make_checkpoint("gpt_oss")), tensor_parallel_size=3, dtype="float32")
