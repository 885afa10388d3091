"""MXFP4 checkpoints (GPT-OSS's experts as FP4 pairs with a power-of-two scale per 32): the
dequantization equals transformers', a GPT-OSS checkpoint whose experts are stored so equals
transformers loading the same files, and malformed ones are refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from compiled_llm import LLM
from compiled_llm.quantization.mxfp4 import FP4_VALUES, dequantize_mxfp4
from tests.models.test_gpt_oss import biting_checkpoint
from tests.utils import assert_matches_transformers

MAGNITUDES = torch.tensor(FP4_VALUES[:8])


def quantize_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An unquantized expert tensor [E, in, out] -> (blocks [E, out, in/32, 16], scales), each
    group's scale the power of two that brings its largest value within FP4's 6."""
    groups = weight.transpose(1, 2).float().unflatten(-1, (-1, 32))  # [E, out, G, 32]
    exponents = torch.ceil(torch.log2(groups.abs().amax(-1).clamp_min(1e-30) / 6.0))
    scaled = groups / torch.exp2(exponents)[..., None]
    codes = (scaled.abs()[..., None] - MAGNITUDES).abs().argmin(-1)  # nearest magnitude
    codes = (codes | (scaled < 0).long() << 3).to(torch.uint8)
    blocks = codes[..., 0::2] | codes[..., 1::2] << 4  # value 2j in byte j's low nibble
    return blocks, (exponents + 127).to(torch.uint8)


def mxfp4_checkpoint(tmp_path: Path) -> Path:
    """biting_checkpoint() with its experts stored as MXFP4, as gpt-oss ships them."""
    shutil.copytree(biting_checkpoint(), tmp_path, dirs_exist_ok=True)
    for path in tmp_path.glob("*.safetensors"):
        tensors = load_file(path)
        for name in [key for key in tensors if key.endswith(("gate_up_proj", "down_proj"))]:
            blocks, scales = quantize_mxfp4(tensors.pop(name))
            tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = blocks, scales
        save_file(tensors, path, metadata={"format": "pt"})
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
        "lm_head"]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_dequantization_equals_transformers():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    gen = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 8, 2, 16), generator=gen, dtype=torch.uint8)
    scales = torch.randint(100, 140, (3, 8, 2), generator=gen, dtype=torch.uint8)
    assert torch.equal(dequantize_mxfp4(blocks, scales),
                       convert_moe_packed_tensors(blocks, scales, dtype=torch.bfloat16))


def test_gpt_oss_mxfp4_checkpoint_equals_transformers(tmp_path):
    ckpt = mxfp4_checkpoint(tmp_path)
    config = json.loads((ckpt / "config.json").read_text())
    config["quantization_config"]["dequantize"] = True  # transformers' CPU path (no kernels)
    (ckpt / "config.json").write_text(json.dumps(config))
    assert_matches_transformers(ckpt, hi=40)


GATE_UP = "model.layers.0.mlp.experts.gate_up_proj"


@pytest.mark.parametrize(("edit", "match"), [
    ("config", "quantization_config.group_size=64 is not understood"),
    ("unpaired", "gate_up_proj_blocks' has no '.*gate_up_proj_scales'"),
    ("float scales", "scales of torch.float32; expected uint8 blocks and uint8"),
    ("both", "gate_up_proj' is stored both unquantized and as"),
])
def test_malformed_checkpoints_are_refused_by_name(tmp_path, edit, match):
    ckpt = mxfp4_checkpoint(tmp_path)
    if edit == "config":
        config = json.loads((ckpt / "config.json").read_text())
        config["quantization_config"]["group_size"] = 64
        (ckpt / "config.json").write_text(json.dumps(config))
    else:
        path = next(ckpt.glob("*.safetensors"))
        tensors = load_file(path)
        scales = tensors.pop(f"{GATE_UP}_scales")
        if edit == "float scales":
            tensors[f"{GATE_UP}_scales"] = scales.float()
        if edit == "both":
            tensors[f"{GATE_UP}_scales"] = scales
            tensors[GATE_UP] = dequantize_mxfp4(tensors[f"{GATE_UP}_blocks"], scales)
        save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=match):
        LLM(str(ckpt), dtype="float32", enforce_eager=True)
