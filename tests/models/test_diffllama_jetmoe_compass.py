"""DiffLlama, JetMoE and Cohere Compass (its text model, and the text stack of its
image-text-to-text checkpoint): each equal to transformers (greedy tokens and prompt logprobs)
on a checkpoint whose norms, biases, lambdas and routers are drawn (transformers saves ones
and zeros); DiffLlama against transformers' eager attention; what they cannot follow is
refused by name."""

from __future__ import annotations

import pytest
import torch

import tests.utils
from compiled_llm import LLM
from compiled_llm.distributed.pipeline_parallel import check_pipeline
from compiled_llm.worker.loader import build_model_config, load_hf_config
from tests.utils import assert_matches_transformers, edited_checkpoint, make_checkpoint


def _drawn(key: str, value: torch.Tensor, gen: torch.Generator) -> torch.Tensor | None:
    """Norm weights around 1; biases, DiffLlama's lambdas and JetMoE's routers drawn."""
    noise = torch.randn(value.shape, generator=gen)
    if key.endswith("norm.weight"):
        return 1 + 0.3 * noise
    if key.endswith((".bias", "router.layer.weight")) or ".lambda_" in key:
        return 0.4 * noise
    return None


def _eager(model_dir):
    """transformers' model on its eager attention (both maps' softmax as written)."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, attn_implementation="eager").eval()


def test_diffllama_equals_transformers_eager(monkeypatch):
    monkeypatch.setattr(tests.utils, "hf_model", _eager)
    assert_matches_transformers(edited_checkpoint("diffllama", _drawn), new_tokens=8, hi=30)


@pytest.mark.parametrize("name", ["jetmoe", "cohere_compass_text", "cohere_compass"])
def test_equals_transformers(name):
    assert_matches_transformers(edited_checkpoint(name, _drawn), new_tokens=8, hi=30)


def test_configs_read():
    _, diff = build_model_config(load_hf_config(make_checkpoint("diffllama")))
    assert diff.num_hidden_layers == 4 and diff.num_layers == 2  # a cache layer per map
    _, jet = build_model_config(load_hf_config(make_checkpoint("jetmoe")))
    assert (jet.num_attention_heads, jet.head_dim, jet.rms_norm_eps) == (4, 16, 1e-5)
    assert (jet.moe.num_experts, jet.moe.num_experts_per_tok) == (4, 2)
    _, compass = build_model_config(load_hf_config(make_checkpoint("cohere_compass_linear")))
    assert compass.layer_ropes == (0, -1) and compass.ropes[0][1]["rope_type"] == "linear"
    assert [compass.layer_window(i) for i in range(2)] == [8, -1]


def _flat_rope(hf):
    hf["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e4}


@pytest.mark.parametrize(("name", "change", "field"), [
    ("diffllama", {"num_key_value_heads": 1, "num_attention_heads": 2}, "num_key_value_heads"),
    ("diffllama", {"attention_dropout": 0.1}, "attention_dropout"),
    ("jetmoe", {"activation_function": "gelu"}, "activation_function"),
    ("jetmoe", {"num_experts_per_tok": 5}, "num_experts_per_tok"),
    ("jetmoe", {"head_dim": 32}, "head_dim"),
    ("cohere_compass_text", {"rope_parameters": {"rope_type": "default"}}, "rope_parameters"),
    ("cohere_compass_text", {"layer_types": ["sliding_attention", "chunked_attention"]},
     "layer_types"),
    ("cohere_compass_text", {"sliding_window": None}, "sliding_window"),
])
def test_refuses_what_it_cannot_follow(name, change, field):
    hf = {**load_hf_config(make_checkpoint(name)), **change}
    with pytest.raises(ValueError, match=field):
        build_model_config(hf)


def test_parallelism_refused_by_name():
    with pytest.raises(ValueError, match="size 2 must divide half of num_key_value_heads 2"):
        LLM(str(make_checkpoint("diffllama")), tensor_parallel_size=2, dtype="float32")
    model_cls, cfg = build_model_config(load_hf_config(make_checkpoint("diffllama")))
    with pytest.raises(ValueError, match="pipeline_parallel_size 2: DiffLlamaForCausalLM"):
        check_pipeline(model_cls, cfg, 2)
