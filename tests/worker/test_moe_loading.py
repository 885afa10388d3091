"""Loading mixture-of-experts checkpoints: per-expert tensors stacked into w13 [E, 2I, H] (gate
rows, then up rows) and w2 [E, H, I] under each model's short name map; a missing expert is an
error naming the parameter; FP8 at load refuses experts off its 128 block, never half-applied."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from compiled_llm.models import DecoderConfig
from compiled_llm.worker.loader import load_model
from tests.utils import make_checkpoint

# config name -> (checkpoint block name, gate, up, down projection names)
LAYOUTS = {"qwen3_moe": ("mlp", "gate_proj", "up_proj", "down_proj"),
           "mixtral": ("block_sparse_moe", "w1", "w3", "w2"),
           "qwen2_moe": ("mlp", "gate_proj", "up_proj", "down_proj")}


def _load(ckpt: Path, **kwargs):
    return load_model(ckpt, torch.float32, torch.device("cpu"), 128, **kwargs)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_experts_stacked_at_load(name):
    ckpt = make_checkpoint(name)
    model = _load(ckpt)
    tensors = load_file(ckpt / "model.safetensors")
    block, gate, up, down = LAYOUTS[name]
    layer = next(i for i, lay in enumerate(model.model.layers) if hasattr(lay.mlp, "experts"))
    experts = model.model.layers[layer].mlp.experts
    inter = experts.intermediate_size
    for expert in range(experts.num_experts):
        prefix = f"model.layers.{layer}.{block}.experts.{expert}"
        assert torch.equal(experts.w13_weight[expert, :inter], tensors[f"{prefix}.{gate}.weight"])
        assert torch.equal(experts.w13_weight[expert, inter:], tensors[f"{prefix}.{up}.weight"])
        assert torch.equal(experts.w2_weight[expert], tensors[f"{prefix}.{down}.weight"])
    router = tensors[f"model.layers.{layer}.{block}.gate.weight"]
    assert torch.equal(model.model.layers[layer].mlp.gate.weight, router)


def test_a_missing_expert_tensor_names_the_stacked_parameter():
    src = make_checkpoint("mixtral")
    ckpt = Path(tempfile.mkdtemp(prefix="cllm-moe-missing-"))
    for path in src.iterdir():
        shutil.copy(path, ckpt / path.name)
    tensors = load_file(src / "model.safetensors")
    del tensors["model.layers.1.block_sparse_moe.experts.3.w3.weight"]
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing tensors.*layers\.1\.mlp\.experts\.w13_weight"):
        _load(ckpt)


def test_fp8_refuses_experts_off_the_fp8_block():
    ckpt = make_checkpoint("qwen3_moe")  # hidden 64: no 128x128 blocks
    with pytest.raises(ValueError, match="block-FP8 experts need hidden_size a multiple of 128"):
        _load(ckpt, quantization="fp8")


def test_moe_config_fields_read_per_architecture():
    base = dict(vocab_size=10, hidden_size=8, intermediate_size=16, num_hidden_layers=4,
                num_attention_heads=2)
    dense = DecoderConfig.from_hf(base)
    assert dense.moe is None
    mixtral = DecoderConfig.from_hf({**base, "num_local_experts": 4, "num_experts_per_tok": 2},
                                    norm_topk_prob=True)
    assert (mixtral.moe.num_experts, mixtral.moe.moe_intermediate_size) == (4, 16)
    assert mixtral.moe.norm_topk_prob and all(mixtral.moe.is_sparse(i) for i in range(4))
    qwen2 = DecoderConfig.from_hf({**base, "num_experts": 4, "num_experts_per_tok": 2,
                                   "moe_intermediate_size": 4, "decoder_sparse_step": 2,
                                   "mlp_only_layers": [3], "qkv_bias": False}, qkv_bias=True)
    assert [qwen2.moe.is_sparse(i) for i in range(4)] == [False, True, False, False]
    assert not qwen2.attention_bias and not qwen2.moe.norm_topk_prob
    assert DecoderConfig.from_hf(base, qkv_bias=True).attention_bias  # Qwen1.5-MoE: no key
