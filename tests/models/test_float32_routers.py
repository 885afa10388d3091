"""Routers transformers keeps in float32 whatever the model's dtype (GLM-4.5's family: gate
weight and e_score_correction_bias; DeepSeek-V2's gate; HunYuan MoE's wg; ERNIE 4.5 MoE's)
stay float32 in a bfloat16 model and hold a bfloat16 checkpoint's float32 router tensors
exactly, so top-k picks transformers' experts; other MoE routers take the model's dtype."""

from __future__ import annotations

import functools
import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from compiled_llm import LLM
from compiled_llm.distributed.parallel_state import TPGroup
from compiled_llm.worker.loader import load_model
from tests.utils import make_checkpoint

# the routers' checkpoint tensors: gate weights (HunYuan's gate.wg) and correction biases
ROUTER = re.compile(r"\.(gate(\.wg)?\.weight|e_score_correction_bias)$")


@functools.cache
def bf16_checkpoint(name: str) -> Path:
    """make_checkpoint(name) in bfloat16 but for its router tensors, drawn anew in float32
    off bfloat16's grid (transformers 5.25 saves GLM-4.5's family that way)."""
    out = Path(tempfile.mkdtemp(prefix=f"cllm-{name}-bf16-"))
    shutil.copytree(make_checkpoint(name), out, dirs_exist_ok=True)
    gen = torch.Generator().manual_seed(11)
    for path in out.glob("*.safetensors"):
        tensors = {key: (torch.randn(value.shape, generator=gen) * 0.3 if ROUTER.search(key)
                         else value.bfloat16()) for key, value in load_file(path).items()}
        save_file(tensors, path, metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    return out


@functools.cache
def hf_bf16(ckpt: Path) -> torch.nn.Module:
    """transformers' model of ckpt loaded in bfloat16."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16).eval()


def router_pairs(model: torch.nn.Module, ckpt: Path) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(our parameter, the checkpoint's tensor) for each router tensor of ckpt that model
    holds (a pipeline stage: its layers')."""
    params = dict(model.named_parameters())
    tensors = load_file(next(ckpt.glob("*.safetensors")))
    names = {key: model.weight_name(key) for key in tensors if ROUTER.search(key)}
    return [(params[ours], tensors[key]) for key, ours in names.items() if ours is not None]


def hf_float32(ckpt: Path) -> dict[str, torch.Tensor]:
    """The tensors transformers' bfloat16 model holds in float32 (its routers, if any)."""
    hf = hf_bf16(ckpt)
    return {name: t for name, t in [*hf.named_parameters(), *hf.named_buffers()]
            if t.dtype == torch.float32 and "inv_freq" not in name}


# every architecture whose transformers class keeps its router float32 (5.25: gate weight
# and correction bias; 5.17: the bias alone but for ERNIE's and HunYuan's weight)
KEPT = ["glm4_moe", "dots1", "deepseek_v2", "deepseek_v3", "glm4_moe_lite", "exaone_moe",
        "solar_open", "ernie4_5_moe", "hunyuan_v1_moe"]


def assert_routers_kept(model: torch.nn.Module, ckpt: Path) -> None:
    """Every router tensor float32 and the checkpoint's exactly; every other parameter
    bfloat16."""
    pairs = router_pairs(model, ckpt)
    assert pairs and all(ours.dtype == torch.float32 and torch.equal(ours, stored)
                         for ours, stored in pairs)
    kept = {id(ours) for ours, _ in pairs}
    assert all(p.dtype == torch.bfloat16 for p in model.parameters() if id(p) not in kept)


def test_llm_in_bfloat16_keeps_the_router_float32():
    """LLM(dtype="bfloat16") on a bfloat16 GLM-4.5 checkpoint with float32 routers."""
    ckpt = bf16_checkpoint("glm4_moe")
    llm = LLM(str(ckpt), enforce_eager=True, dtype="bfloat16")
    assert_routers_kept(llm.engine.executor.worker.runner.model, ckpt)
    llm.shutdown()


@pytest.mark.parametrize("name", KEPT)
def test_float32_routers_hold_the_checkpoint_exactly(name):
    """Loaded in bfloat16, the routers are float32 and exact, as is each tensor transformers
    keeps float32."""
    ckpt = bf16_checkpoint(name)
    model = load_model(ckpt, torch.bfloat16, torch.device("cpu"), 64)
    assert_routers_kept(model, ckpt)
    ours = [p for p, _ in router_pairs(model, ckpt)]
    # transformers 5.17 keeps fewer (GLM-4.5's family: the bias alone; DeepSeek-V2: none)
    assert all(any(torch.equal(t, p) for p in ours) for t in hf_float32(ckpt).values())


@pytest.mark.parametrize("pipeline", [False, True])
def test_tensor_and_pipeline_parallel_builds_keep_the_router_float32(pipeline):
    """A tensor-parallel rank (router replicated) and a pipeline stage hold it exactly too."""
    ckpt = bf16_checkpoint("glm4_moe")
    group = (TPGroup(1, 2, "unused", None, None) if not pipeline else
             TPGroup(0, 1, "unused", None, None, global_rank=1, pipeline_rank=1,
                     pipeline_size=2))
    model = load_model(ckpt, torch.bfloat16, torch.device("cpu"), 64, tp=group,
                       pipeline_parallel_size=2 if pipeline else 1)
    pairs = router_pairs(model, ckpt)
    assert pairs and all(ours.dtype == torch.float32 and torch.equal(ours, stored)
                         for ours, stored in pairs)


@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral", "minimax_m2"])
def test_other_routers_take_the_model_dtype(name):
    """Qwen3-MoE's, Mixtral's and MiniMax-M2's routers (MiniMax's correction bias too) are
    bfloat16 in a bfloat16 model, in transformers as here."""
    ckpt = bf16_checkpoint(name)
    model = load_model(ckpt, torch.bfloat16, torch.device("cpu"), 64)
    pairs = router_pairs(model, ckpt)
    assert pairs and all(ours.dtype == torch.bfloat16 and torch.equal(ours, stored.bfloat16())
                         for ours, stored in pairs)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert not hf_float32(ckpt)


@pytest.mark.parametrize("name", ["glm4_moe", "hunyuan_v1_moe"])
def test_expert_choice_matches_transformers(name):
    """Over 4096 bfloat16 hidden states, layer 1's router picks transformers' experts with
    its weights, where a router rounded to bfloat16 picks others for some tokens."""
    ckpt = bf16_checkpoint(name)
    hf_gate = hf_bf16(ckpt).model.layers[1].mlp.gate
    if next(hf_gate.parameters()).dtype != torch.float32:
        pytest.skip("this transformers (5.17) rounds the router weight to bfloat16")
    block = load_model(ckpt, torch.bfloat16, torch.device("cpu"), 64).model.layers[1].mlp
    hidden = torch.randn(4096, 64, generator=torch.Generator().manual_seed(0)).bfloat16()
    with torch.no_grad():
        _, hf_weights, hf_ids = hf_gate(hidden)
        weights, ids = block.route(block.gate(hidden))
        block.gate.weight.data = block.gate.weight.data.bfloat16().float()
        rounded = block.route(block.gate(hidden))[1]
    order, hf_order = ids.argsort(-1), hf_ids.argsort(-1)
    assert torch.equal(ids.gather(-1, order), hf_ids.gather(-1, hf_order))
    torch.testing.assert_close(weights.gather(-1, order), hf_weights.float().gather(-1, hf_order))
    assert not torch.equal(rounded.sort(-1).values, ids.sort(-1).values)
