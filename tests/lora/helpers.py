"""LoRA test helpers: PEFT adapters made with peft over the tiny random checkpoints, and
transformers' greedy tokens with an adapter merged."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import torch

from tests.utils import hf_greedy

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@functools.cache
def make_adapter(base_dir: Path, seed: int, rank: int = 8, targets: tuple | str = ALL_TARGETS,
                 alpha: int = 16, use_rslora: bool = False, rank_pattern: tuple = (),
                 alpha_pattern: tuple = (), safe: bool = True) -> Path:
    """A random PEFT LoRA (non-zero B) of `rank` on `targets` (module names, or a str: PEFT's
    regex over full module names, saved as written), with PEFT's per-module rank_pattern and
    alpha_pattern ((regex, value) pairs), saved as safetensors or (safe False) a pickled
    adapter_model.bin; returns its dir."""
    import transformers
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_pretrained(base_dir)
    target_modules = targets if isinstance(targets, str) else list(targets)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=target_modules,
                        init_lora_weights=False, use_rslora=use_rslora,
                        rank_pattern=dict(rank_pattern), alpha_pattern=dict(alpha_pattern))
    peft_model = get_peft_model(model, config)
    with torch.no_grad():  # larger deltas than peft's init: adapters visibly change tokens
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.normal_(0, 0.2)
    out = Path(tempfile.mkdtemp(prefix=f"cllm-lora{seed}-"))
    peft_model.save_pretrained(out, safe_serialization=safe)
    return out


def with_config(adapter_dir: Path, **changes) -> Path:
    """A copy of an adapter directory whose adapter_config.json has `changes` written over."""
    import json
    import shutil

    out = Path(tempfile.mkdtemp(prefix="cllm-lora-config-"))
    shutil.copytree(adapter_dir, out, dirs_exist_ok=True)
    config = json.loads((out / "adapter_config.json").read_text())
    (out / "adapter_config.json").write_text(json.dumps({**config, **changes}))
    return out


def merged_greedy(base_dir: Path, adapter_dir: Path | None, prompts: list[list[int]],
                  max_new_tokens: int) -> list[list[int]]:
    """transformers + peft greedy tokens with the adapter merged (None: the base model)."""
    return [list(tokens) for tokens in _merged_greedy(
        base_dir, adapter_dir, tuple(tuple(p) for p in prompts), max_new_tokens)]


@functools.cache
def _merged_greedy(base_dir: Path, adapter_dir: Path | None, prompts: tuple,
                   max_new_tokens: int) -> tuple:
    import transformers
    from peft import PeftModel

    if adapter_dir is None:
        merged_dir = base_dir
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(base_dir)
        merged = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
        merged_dir = Path(tempfile.mkdtemp(prefix="cllm-merged-"))
        merged.save_pretrained(merged_dir, safe_serialization=True)
    return tuple(map(tuple, hf_greedy(merged_dir, [list(p) for p in prompts], max_new_tokens)))
