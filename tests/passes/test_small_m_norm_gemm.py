"""SmallMAddRMSNormGemmFusionPass with small-M forced on the CPU: a GEMM (plain or with the
SiLU·mul epilogue) over the normed output of small_m_mm_add_rms_norm that nothing else reads
becomes `compiled_llm::small_m_mm_add_rms_norm_mm` (toy graph, Llama/Qwen3 layers), a normed
output with another reader stays, the flag is on by default, off at -O0 and by itself; outputs
match the unfused path."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.passes import PassConfig
from compiled_llm.worker.loader import load_model
from models.layers import rms_norm
from tests.passes.helpers import capture_model, capture_run
from tests.utils import make_checkpoint

ON = PassConfig(small_m_gemm_on_cpu=True, inline_fused_ops=False,
                enable_small_m_norm_prologue=True)
NAME = "SmallMAddRMSNormGemmFusionPass"
PAIR = "compiled_llm.small_m_mm_add_rms_norm_mm"
NORM = "compiled_llm.small_m_mm_add_rms_norm"
LAYERS = 2  # tests/utils.py SMALL


def _norm_then_qkv(x, w_o, residual, norm_weight, w_qkv):
    summed = x @ w_o.t() + residual
    return rms_norm(summed, norm_weight, 1e-6) @ w_qkv.t(), summed


def _normed_read_twice(x, w_o, residual, norm_weight, w_qkv):
    normed = rms_norm(x @ w_o.t() + residual, norm_weight, 1e-6)
    return normed @ w_qkv.t(), normed.sum(-1)


def _args(dtype=torch.float32, tokens=3):
    g = torch.Generator().manual_seed(0)
    x, w_o, residual, w_qkv = (torch.randn(*s, generator=g) / s[-1] ** 0.5
                               for s in ((tokens, 48), (32, 48), (tokens, 32), (40, 32)))
    norm_weight = 1 + 0.1 * torch.randn(32, generator=g)
    return [t.to(dtype) for t in (x, w_o, residual, norm_weight, w_qkv)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_toy_gemm_takes_the_norm_before_it(dtype):
    args = _args(dtype)
    out, _, after, m = capture_run(_norm_then_qkv, args, ON)
    assert m.matches(NAME) == 1 and after[PAIR] == 1
    assert after[NORM] == 0 and after["compiled_llm.small_m_mm"] == 0
    for o, r in zip(out, _norm_then_qkv(*args)):  # CPU: the unfused ops as written
        torch.testing.assert_close(o, r, rtol=0, atol=0)


def test_normed_output_with_another_reader_stays():
    out, _, after, m = capture_run(_normed_read_twice, _args(), ON)
    assert m.matches(NAME) == 0 and after[PAIR] == 0 and after[NORM] == 1
    for o, r in zip(out, _normed_read_twice(*_args())):
        torch.testing.assert_close(o, r, rtol=0, atol=0)


def test_on_by_default_off_at_o0_and_by_its_flag():
    from compiled_llm.optimization import LEVELS

    assert PassConfig().enable_small_m_norm_prologue is True
    assert LEVELS[0].passes["enable_small_m_norm_prologue"] is False
    _, _, after, m = capture_run(_norm_then_qkv, _args(),
                                 PassConfig(small_m_gemm_on_cpu=True, inline_fused_ops=False,
                                            enable_small_m_norm_prologue=False))
    assert m.matches(NAME) == 0 and after[PAIR] == 0 and after[NORM] == 1


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_model_layers_gate_up_and_next_qkv_take_the_norms(name):
    model = load_model(make_checkpoint(name), torch.float32, torch.device("cpu"), 512)
    ref, out, _, after, m = capture_model(model, 10, ON)
    # per layer: gate_up after the post-attention norm, the next layer's qkv after down's norm;
    # the last down's norm feeds the final norm's reader (not a small-M GEMM), layer 0's qkv
    # the embedding's norm
    assert m.matches(NAME) == 2 * LAYERS - 1 and after[PAIR] == 2 * LAYERS - 1
    assert after[NORM] == 1 and after["compiled_llm.small_m_mm"] == 1
    assert after["compiled_llm.small_m_gate_up_silu_mul"] == 0
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
