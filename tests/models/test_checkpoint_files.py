"""Checkpoint directories as users bring them: RoPE tables some exporters save beside the weights
(ColossalAI's cos_cached/sin_cached, skipped as vLLM skips them) and the files HF's Trainer
leaves beside pickle weights (never read as weights). Greedy tokens equal transformers'."""

from __future__ import annotations

import argparse
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from compiled_llm import LLM, SamplingParams
from tests.utils import hf_greedy, make_checkpoint, random_prompts

NEW_TOKENS = 6


def _copy(dest):
    out = dest / "ckpt"
    shutil.copytree(make_checkpoint("llama"), out)
    return out, load_file(out / "model.safetensors")


def _greedy(ckpt, prompts, **kwargs) -> list[list[int]]:
    llm = LLM(str(ckpt), enforce_eager=True, dtype="float32", **kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def test_saved_rope_tables_are_skipped(tmp_path):
    ckpt, tensors = _copy(tmp_path)
    for layer in range(2):
        for table in ("inv_freq", "cos_cached", "sin_cached"):
            tensors[f"model.layers.{layer}.self_attn.rotary_emb.{table}"] = torch.ones(8)
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})
    prompts = random_prompts(2, 300, seed=4)
    assert _greedy(ckpt, prompts) == hf_greedy(make_checkpoint("llama"), prompts, NEW_TOKENS)
    tensors["model.layers.0.self_attn.unknown.weight"] = torch.ones(8)  # still refused
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="'model.layers.0.self_attn.unknown.weight' matches no"):
        _greedy(ckpt, prompts)


def test_trainer_files_beside_pickle_weights_are_not_read(tmp_path):
    ckpt, tensors = _copy(tmp_path)
    (ckpt / "model.safetensors").unlink()
    torch.save(tensors, ckpt / "pytorch_model.bin")
    # objects that weights_only loading refuses: read as weights, they would fail the load
    torch.save(argparse.Namespace(learning_rate=1e-4), ckpt / "training_args.bin")
    torch.save({"state": argparse.Namespace()}, ckpt / "optimizer.bin")
    prompts = random_prompts(2, 300, seed=5)
    expected = hf_greedy(make_checkpoint("llama"), prompts, NEW_TOKENS)
    assert _greedy(ckpt, prompts) == expected  # load_format "auto" reads .bin, as vLLM
