"""GPT-NeoX and Phi beyond the transformers sweep's configs: the older config.json spellings
(Pythia's rotary_pct and rotary_emb_base, phi-2's top-level partial_rotary_factor), legacy
rope_scaling over the rotary dims, the buffers old checkpoints saved; and what is refused by
name (tensor and pipeline parallelism, LoRA, a head_dim GPT-NeoX's attention does not use)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from compiled_llm import LLM
from compiled_llm.distributed.pipeline_parallel import check_pipeline
from compiled_llm.worker.loader import build_model_config, load_hf_config
from tests.models.test_config_options import assert_matches_transformers
from tests.utils import make_checkpoint, random_prompts


def _legacy_copy(name: str, dest, edit, extra_tensors=None):
    """A copy of checkpoint `name` with config.json edited by `edit`; extra_tensors saved
    beside its weights (a None value drops that tensor)."""
    out = dest / name
    shutil.copytree(make_checkpoint(name), out)
    cfg = json.loads((out / "config.json").read_text())
    edit(cfg)
    (out / "config.json").write_text(json.dumps(cfg))
    if extra_tensors:
        tensors = load_file(out / "model.safetensors")
        tensors = {key: value for key, value in {**tensors, **extra_tensors}.items()
                   if value is not None}
        save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


def _pythia(cfg: dict) -> None:  # transformers 4.x's spelling, linear RoPE scaling on top
    cfg.pop("rope_parameters")
    cfg.pop("attention_bias")  # transformers' default: biased
    cfg.update(rotary_pct=0.5, rotary_emb_base=500.0,
               rope_scaling={"type": "linear", "factor": 2.0})


def _phi2(cfg: dict) -> None:  # phi-2's spelling: top-level factor and theta; a tied head
    cfg.pop("rope_parameters")
    cfg.update(partial_rotary_factor=0.75, rope_theta=500.0, tie_word_embeddings=True)


def test_pythia_config_and_old_buffers_match_transformers(tmp_path):
    buffers = {"gpt_neox.layers.0.attention.bias": torch.ones(1, 1, 8, 8, dtype=torch.bool),
               "gpt_neox.layers.0.attention.masked_bias": torch.tensor(-1e9),
               "gpt_neox.layers.0.attention.rotary_emb.inv_freq": torch.ones(4)}
    ckpt = _legacy_copy("gpt_neox", tmp_path, _pythia, buffers)
    _, cfg = build_model_config(load_hf_config(ckpt))
    assert (cfg.rotary_dim, cfg.rope_theta, cfg.attention_bias) == (8, 500.0, True)
    assert_matches_transformers(ckpt, random_prompts(4, 300, hi=40, seed=3))


def test_phi2_config_matches_transformers(tmp_path):
    ckpt = _legacy_copy("phi", tmp_path, _phi2, {"lm_head.weight": None})  # its bias stays
    _, cfg = build_model_config(load_hf_config(ckpt))
    assert (cfg.rotary_dim, cfg.rope_theta, cfg.tie_word_embeddings) == (12, 500.0, True)
    assert_matches_transformers(ckpt, random_prompts(4, 300, hi=40, seed=4))


@pytest.mark.parametrize(("name", "arch"), [("gpt_neox", "GPTNeoXForCausalLM"),
                                            ("phi", "PhiForCausalLM")])
def test_pipeline_parallelism_and_lora_are_refused_by_name(name, arch):
    """(Tensor parallelism splits them by heads: tests/distributed/test_tp_generate.py.)"""
    ckpt = make_checkpoint(name)
    model_cls, cfg = build_model_config(load_hf_config(ckpt))
    with pytest.raises(ValueError, match=f"pipeline_parallel_size 2: {arch}"):
        check_pipeline(model_cls, cfg, 2)
    with pytest.raises(ValueError, match=f"enable_lora: {arch} has no module"):
        LLM(str(ckpt), enable_lora=True, enforce_eager=True)


def test_options_not_followed_are_refused_by_name():
    hf = load_hf_config(make_checkpoint("gpt_neox"))
    with pytest.raises(ValueError, match="head_dim 32 is not supported for GPT-NeoX"):
        build_model_config({**hf, "head_dim": 32})
    with pytest.raises(ValueError, match="partial_rotary_factor must turn an even number"):
        build_model_config({**hf, "rope_parameters": {**hf["rope_parameters"],
                                                      "partial_rotary_factor": 0.2}})
    with pytest.raises(ValueError, match="'proportional' is not supported"):
        build_model_config({**hf, "rope_parameters": {"rope_type": "proportional",
                                                      "rope_theta": 1e4, "factor": 2.0}})
