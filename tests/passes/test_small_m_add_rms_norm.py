"""SmallMGemmAddRMSNormFusionPass with small-M forced on the CPU: the residual add + RMSNorm after
a small_m_mm that nothing else reads becomes `compiled_llm::small_m_mm_add_rms_norm` (either
operand order; toy graph, Llama/Qwen3 layers, through Inductor with no norm kernel left), a shared
product and FP8 layers stay, -O0 and the flag turn it off; outputs match the unfused path."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.passes import PassConfig
from compiled_llm.worker.loader import load_model
from models.layers import rms_norm
from tests.passes.helpers import capture_model, capture_run, compile_run, kernels_with
from tests.utils import make_checkpoint

# the prologue pass after this one has its own test (test_small_m_norm_gemm.py)
FORCED = PassConfig(small_m_gemm_on_cpu=True, inline_fused_ops=False,
                    enable_small_m_norm_prologue=False)
NAME = "SmallMGemmAddRMSNormFusionPass"
FUSED = "compiled_llm.small_m_mm_add_rms_norm"
LAYERS = 2  # tests/utils.py SMALL


def _proj_add_norm(x, w_o, residual, norm_weight):
    summed = x @ w_o.t() + residual
    return rms_norm(summed, norm_weight, 1e-6), summed


def _residual_first(x, w_o, residual, norm_weight):
    summed = residual + x @ w_o.t()
    return rms_norm(summed, norm_weight, 1e-6), summed


def _shared(x, w_o, residual, norm_weight):
    product = x @ w_o.t()
    summed = product + residual
    return rms_norm(summed, norm_weight, 1e-6), summed, product.sum(-1)  # a second reader


def _args(dtype=torch.float32, tokens=5):
    g = torch.Generator().manual_seed(0)
    x, w_o, residual = (torch.randn(*s, generator=g) / s[-1] ** 0.5
                        for s in ((tokens, 48), (32, 48), (tokens, 32)))
    norm_weight = 1 + 0.1 * torch.randn(32, generator=g)
    return [t.to(dtype) for t in (x, w_o, residual, norm_weight)]


@pytest.mark.parametrize("fn", [_proj_add_norm, _residual_first])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_toy_projection_takes_the_add_and_norm(fn, dtype):
    args = _args(dtype)
    out, before, after, m = capture_run(fn, args, FORCED)
    assert m.matches("SmallMGemmPass") == 1 and m.matches(NAME) == 1
    assert before["aten.mm"] == 1 and after["aten.mm"] == 0 and after[FUSED] == 1
    assert after["compiled_llm.small_m_mm"] == 0 and after["compiled_llm.fused_add_rms_norm"] == 0
    for o, r in zip(out, fn(*args)):  # CPU: torch.mm, then the add and the norm as written
        torch.testing.assert_close(o, r, rtol=0, atol=0)


def test_product_with_another_reader_stays():
    out, _, after, m = capture_run(_shared, _args(), FORCED)
    assert m.matches(NAME) == 0 and after[FUSED] == 0
    assert after["compiled_llm.fused_add_rms_norm"] == 1 and after["compiled_llm.small_m_mm"] == 1
    for o, r in zip(out, _shared(*_args())):
        torch.testing.assert_close(o, r, rtol=0, atol=0)


@pytest.mark.parametrize("config", [
    PassConfig(inline_fused_ops=False),  # small-M is CUDA-only by default
    PassConfig(small_m_gemm_on_cpu=True, inline_fused_ops=False,
               enable_small_m_add_rms_norm=False),
])
def test_off_on_cpu_by_default_and_by_its_flag(config):
    _, _, after, m = capture_run(_proj_add_norm, _args(), config)
    assert m.matches(NAME) == 0 and after[FUSED] == 0
    assert after["compiled_llm.fused_add_rms_norm"] == 1


def test_o0_turns_it_off():
    from compiled_llm.optimization import LEVELS

    assert LEVELS[0].passes["enable_small_m_add_rms_norm"] is False
    assert PassConfig().enable_small_m_add_rms_norm is True


def test_through_inductor_no_norm_kernel():
    args = _args(torch.bfloat16, tokens=3)
    out, code, m = compile_run(_proj_add_norm, args, PassConfig(small_m_gemm_on_cpu=True))
    assert m.matches(NAME) == 1 and FUSED in code
    assert not kernels_with(code, "rsqrt")  # no generated kernel normalizes
    for o, r in zip(out, _proj_add_norm(*args)):
        torch.testing.assert_close(o, r, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_model_layers_o_and_down_take_the_add_and_norm(name):
    model = load_model(make_checkpoint(name), torch.float32, torch.device("cpu"), 512)
    ref, out, _, after, m = capture_model(model, 10, FORCED)
    # per layer: o_proj -> post-attention norm, down_proj -> the next layer's (or the final) norm
    assert m.matches(NAME) == 2 * LAYERS and after[FUSED] == 2 * LAYERS
    assert after["compiled_llm.fused_add_rms_norm"] == 0
    assert after["compiled_llm.small_m_mm"] == LAYERS  # qkv stays plain
    assert after["compiled_llm.small_m_gate_up_silu_mul"] == LAYERS  # the SiLU·mul epilogue
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_fp8_layers_are_not_matched():
    model = load_model(make_checkpoint("qwen3"), torch.float32, torch.device("cpu"), 512,
                       quantization="fp8")
    _, _, _, after, m = capture_model(model, 10, FORCED)
    assert m.matches(NAME) == 0 and after[FUSED] == 0


def _broadcast_residual(x, w_o, residual, norm_weight):
    summed = x[:1] @ w_o.t() + residual  # [1, N] + [T, N]: broadcast, not a residual site
    return rms_norm(summed, norm_weight, 1e-6), summed


def test_a_broadcast_product_stays():
    out, _, after, m = capture_run(_broadcast_residual, _args(), FORCED, dynamic=False)
    assert m.matches(NAME) == 0 and after[FUSED] == 0
    for o, r in zip(out, _broadcast_residual(*_args())):
        torch.testing.assert_close(o, r, rtol=0, atol=0)
