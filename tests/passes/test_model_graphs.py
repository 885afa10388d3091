"""The passes on the graphs the registry's models really produce: one match per site, op counts,
numerics unchanged, and (through Inductor on CPU) one generated kernel per norm site."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.passes import PassConfig
from compiled_llm.worker.loader import load_model
from tests.passes.helpers import (
    capture_model,
    kernels_with,
    reduction_sites,
    run_model,
    scheduled_nodes,
)
from tests.utils import make_checkpoint

LAYERS = 2  # tests/utils.py SMALL


def _model(name: str, quantization: str | None = None):
    return load_model(make_checkpoint(name), torch.float32, torch.device("cpu"), 512,
                      quantization=quantization)


def test_llama_through_inductor_one_kernel_per_norm_site():
    model = _model("llama")
    ref, _, _ = run_model(model, 12, False)
    with scheduled_nodes() as nodes:
        out, code, m = run_model(model, 12, PassConfig())
    # Inductor folds the residual add into addmm on CPU; the pass unfolds it again
    assert m.matches("AddRMSNormFusionPass") == 2 * LAYERS
    assert m.matches("RMSNormFusionPass") == 1  # layer 0's input norm has no residual
    assert m.matches("SiluMulFusionPass") == LAYERS
    assert len(kernels_with(code, "sqrt")) == 2 * LAYERS + 1  # every norm site: one kernel
    sites = reduction_sites(nodes)  # ... with its statistics: no kernel reads them
    assert len(sites) == 2 * LAYERS + 1 and all(readers == 0 for _, readers in sites)
    assert len(kernels_with(code, "exp")) == LAYERS  # every SiLU·mul: one kernel
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["llama", "mistral", "qwen2", "qwen3"])
def test_registry_models_match_every_site(name):
    ref, out, before, after, m = capture_model(_model(name), 10, PassConfig(inline_fused_ops=False))
    qk_norms = 2 * LAYERS if name == "qwen3" else 0
    assert m.matches("AddRMSNormFusionPass") == 2 * LAYERS
    assert m.matches("RMSNormFusionPass") == 1 + qk_norms
    assert m.matches("SiluMulFusionPass") == LAYERS
    assert before["aten.rsqrt"] == 2 * LAYERS + 1 + qk_norms and after["aten.rsqrt"] == 0
    assert after["compiled_llm.fused_add_rms_norm"] == 2 * LAYERS
    assert before["aten.index"] == 1  # RoPE's cos/sin rows: gathered once a step, not a layer
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_qwen3_fp8_quant_fusions():
    ref, out, before, after, m = capture_model(_model("qwen3", "fp8"), 10,
                                               PassConfig(inline_fused_ops=False))
    assert before["compiled_llm.quant_fp8_per_token"] == 7 * LAYERS  # q k v o gate up down
    # input and post-attention norms feed q/k/v and gate/up; the final norm feeds lm_head
    assert m.matches("RMSNormQuantFusionPass") == 2 * LAYERS
    assert m.matches("SiluMulQuantFusionPass") == LAYERS
    assert after["compiled_llm.quant_fp8_per_token"] == LAYERS  # o_proj reads attention
    assert after["compiled_llm.fp8_gemm"] == 4 * LAYERS  # q/k/v and gate/up fused (one each)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
