"""Aria's text model (AriaTextForCausalLM) and Emu3's (Emu3ForCausalLM) equal transformers
(greedy tokens, prompt logprobs; random norms and biases); Aria's MoE layer (softmax over the
top-k logits, ungated shared experts, [E, in, out] expert stacks) equals transformers' own
layer; either spelling of the expert stacks and of the image-text-to-text prefixes loads the
same; what we cannot follow is refused by name. (Their XForConditionalGeneration checkpoints:
tests/models/test_multimodal_text_only.py.)"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from compiled_llm.worker.loader import build_model_config, load_hf_config, load_model
from tests.utils import assert_matches_transformers, edited_checkpoint, hf_model, make_checkpoint


def _random_norms(key: str, value: torch.Tensor, gen: torch.Generator) -> torch.Tensor | None:
    """Norm weights and biases drawn (transformers saves ones and zeros)."""
    if key.endswith(("norm.weight", ".bias")):
        return value + torch.randn(value.shape, generator=gen) * 0.3
    return None


@pytest.mark.parametrize("name", ["aria_text", "aria_text_options", "emu3"])
def test_matches_transformers(name):
    assert_matches_transformers(edited_checkpoint(name, _random_norms), new_tokens=8)


def test_moe_layer_equals_transformers():
    """One layer's MoE block on random tokens: routing, the shared MLP (biased GELU here) and
    the transposed stacks, against transformers' AriaTextMoELayer."""
    ckpt = edited_checkpoint("aria_text_options", _random_norms)
    ours = load_model(ckpt, torch.float32, torch.device("cpu"), 64).model.layers[1].mlp
    theirs = hf_model(ckpt).model.layers[1].mlp
    hidden = torch.randn(40, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(hidden), theirs(hidden), atol=1e-5, rtol=1e-5)


def _renamed(name: str, renames: tuple[tuple[str, str], ...]) -> Path:
    """A copy of make_checkpoint(name) whose tensor names have each (old, new) replaced."""
    out = Path(tempfile.mkdtemp(prefix=f"cllm-{name}-renamed-"))
    shutil.copytree(make_checkpoint(name), out, dirs_exist_ok=True)
    path = out / "model.safetensors"
    tensors = load_file(path)
    for old, new in renames:
        tensors = {key.replace(old, new): value for key, value in tensors.items()}
    save_file(tensors, path, metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("name, renames", [
    # transformers 5.25's in-memory names of the expert stacks (hidden = 2 * intermediate: the
    # square gate_up_proj is transposed by layout, not told apart by shape)
    ("aria_text", ((".experts.fc1.weight", ".experts.gate_up_proj"),
                   (".experts.fc2.weight", ".experts.down_proj"))),
    ("aria_vl", (("language_model.model.", "model.language_model."),
                 ("language_model.lm_head.", "lm_head."),
                 (".experts.fc1.weight", ".experts.gate_up_proj"),
                 (".experts.fc2.weight", ".experts.down_proj"))),
    # Emu3's transformers 5 layout: model.text_model.*, model.vqmodel.*, lm_head
    ("emu3_vl", (("text_model.model.", "model.text_model."),
                 ("text_model.lm_head.", "lm_head."), ("vqmodel.", "model.vqmodel."))),
])
def test_either_weight_spelling_loads_the_same(name, renames):
    ckpt = _renamed(name, renames)
    ours = [load_model(d, torch.float32, torch.device("cpu"), 64).state_dict()
            for d in (make_checkpoint(name), ckpt)]
    assert ours[0].keys() == ours[1].keys()
    assert all(torch.equal(ours[0][k], ours[1][k]) for k in ours[0])


def test_aria_config_reads_its_expert_keys():
    _, cfg = build_model_config(load_hf_config(make_checkpoint("aria_vl")))
    moe = cfg.moe
    assert (moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size,
            moe.shared_expert_intermediate_size, moe.norm_topk_prob) == (4, 2, 32, 64, True)
    assert all(moe.is_sparse(i) for i in range(cfg.num_hidden_layers))


@pytest.mark.parametrize("change, match", [
    # transformers keeps a zero-width shared MLP: refused, not guessed
    ({"moe_num_shared_experts": 0}, "moe_num_shared_experts 0 is not supported"),
    ({"quantization_config": {"quant_method": "fp8"}}, "quantization_config: quantized Aria"),
])
def test_refused_by_name(change, match):
    hf = load_hf_config(make_checkpoint("aria_text"))
    with pytest.raises(ValueError, match=match):
        build_model_config({**hf, **change})

