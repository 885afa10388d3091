"""OPT and GPT-2 (learned absolute positions, no RoPE): their layout options and checkpoints
of the base model (names without `model.` / `transformer.`, GPT-2's saved mask buffers) give
transformers' tokens and logprobs; max_model_len stays within the position table; tensor and
pipeline parallelism and LoRA are refused by name."""

from __future__ import annotations

import shutil

import pytest
import torch

from compiled_llm import LLM
from compiled_llm.worker.loader import build_model_config, load_hf_config
from tests.models.test_config_options import assert_matches_transformers
from tests.utils import make_checkpoint, random_prompts

ARCHS = {"opt": "OPTForCausalLM", "gpt2": "GPT2LMHeadModel"}


@pytest.mark.parametrize("name", ["opt_350m_layout", "gpt2_options"])
def test_layout_options_match_transformers(name):
    """OPT: post-norm layers, project_in/out; GPT-2: scale_attn_by_inverse_layer_idx,
    n_inner, an untied LM head."""
    assert_matches_transformers(make_checkpoint(name), random_prompts(3, 300, lo=5, hi=40, seed=5))


def _as_base_model(name: str, dest, prefix: str, extra: dict[str, torch.Tensor]):
    """A copy of checkpoint `name` saved as its base model (prefix stripped, no lm_head), as
    facebook/opt-* and gpt2 ship, with `extra` tensors added."""
    from safetensors.torch import load_file, save_file

    out = dest / name
    shutil.copytree(make_checkpoint(name), out)
    tensors = load_file(out / "model.safetensors")
    renamed = {key.removeprefix(prefix): value for key, value in tensors.items()
               if not key.startswith("lm_head.")}
    save_file({**renamed, **extra}, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("name,prefix", [("opt", "model."), ("gpt2", "transformer.")])
def test_checkpoints_of_the_base_model_load(name, prefix, tmp_path):
    mask = torch.tril(torch.ones(512, 512, dtype=torch.bool)).view(1, 1, 512, 512)
    extra = {f"h.{i}.attn.{buffer}": mask.clone() if buffer == "bias" else torch.tensor(-1e4)
             for i in range(2) for buffer in ("bias", "masked_bias")} if name == "gpt2" else {}
    ckpt = _as_base_model(name, tmp_path, prefix, extra)
    assert_matches_transformers(ckpt, random_prompts(3, 300, lo=5, hi=30, seed=7))


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_max_model_len_is_the_position_table(name):
    ckpt = make_checkpoint(name)
    assert build_model_config(load_hf_config(ckpt))[1].max_position_embeddings == 512
    with LLM(str(ckpt), enforce_eager=True, dtype="float32", max_model_len=512) as llm:
        assert llm.engine.max_model_len == 512
    with pytest.raises(ValueError, match="max_model_len 513 exceeds the model's maximum length"):
        LLM(str(ckpt), enforce_eager=True, dtype="float32", max_model_len=513)


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_pipeline_parallelism_is_refused_by_name(name):
    """(Tensor parallelism splits them by heads: tests/distributed/test_tp_generate.py.)"""
    match = f"pipeline_parallel_size 2: {ARCHS[name]} is not a decoder with a layer"
    with pytest.raises(ValueError, match=match):
        LLM(str(make_checkpoint(name)), dtype="float32", enforce_eager=True,
            engine_core_process=False, pipeline_parallel_size=2)


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_lora_is_refused_by_name(name):
    with pytest.raises(ValueError, match=f"enable_lora: {ARCHS[name]} has no module"):
        LLM(str(make_checkpoint(name)), enable_lora=True, enforce_eager=True)


def test_options_it_cannot_follow_are_refused_by_name():
    gpt2 = {"architectures": ["GPT2LMHeadModel"], "vocab_size": 32, "n_embd": 32, "n_layer": 2,
            "n_head": 2}
    with pytest.raises(ValueError, match="add_cross_attention=True is not supported"):
        build_model_config({**gpt2, "add_cross_attention": True})
    with pytest.raises(ValueError, match="activation_function 'swiglu' is not supported"):
        build_model_config({**gpt2, "activation_function": "swiglu"})
    opt = {"architectures": ["OPTForCausalLM"], "vocab_size": 32, "hidden_size": 32,
           "num_attention_heads": 2, "activation_function": "swiglu"}
    with pytest.raises(ValueError, match="activation_function 'swiglu' is not supported for OPT"):
        build_model_config(opt)
    # transformers' defaults fill what config.json leaves out
    cfg = build_model_config({**gpt2})[1]
    assert (cfg.intermediate_size, cfg.max_position_embeddings, cfg.hidden_act) == (
        128, 1024, "gelu_new")
    cfg = build_model_config({**opt, "activation_function": "relu"})[1]
    assert (cfg.intermediate_size, cfg.num_hidden_layers, cfg.word_embed_proj_dim) == (
        3072, 12, 32)
