"""SiluMulSmallMGemmFusionPass with small-M forced on the CPU: the down projection's small_m_mm of
a silu_and_mul that nothing else reads becomes `compiled_llm::small_m_mm_silu_mul` (toy graph,
Llama/Qwen3 layers, through Inductor with no separate SiLU·mul kernel), a shared activation and
FP8 MLPs stay, -O0 and the flag turn it off; outputs match the unfused path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from compiled_llm.passes import PassConfig
from compiled_llm.worker.loader import load_model
from tests.passes.helpers import capture_model, capture_run, compile_run, kernels_with
from tests.utils import make_checkpoint

FORCED = PassConfig(small_m_gemm_on_cpu=True, enable_small_m_silu_mul=False, inline_fused_ops=False,
                    enable_silu_mul_small_m=True, enable_small_m_add_rms_norm=False)
NAME = "SiluMulSmallMGemmFusionPass"
LAYERS = 2  # tests/utils.py SMALL


def _mlp(x, w_gate_up, w_down):
    gate, up = (x @ w_gate_up.t()).chunk(2, dim=-1)
    return (F.silu(gate) * up) @ w_down.t()


def _shared(x, w_gate_up, w_down):
    gate, up = (x @ w_gate_up.t()).chunk(2, dim=-1)
    act = F.silu(gate) * up
    return act @ w_down.t(), act.sum(-1)  # the activation has a second reader: not fused


def _args(dtype=torch.float32, tokens=5):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(*s, generator=g) / s[-1] ** 0.5).to(dtype)
            for s in ((tokens, 32), (96, 32), (32, 48))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_toy_mlp_down_takes_the_activation(dtype):
    args = _args(dtype)
    out, before, after, m = capture_run(_mlp, args, FORCED)
    assert m.matches("SmallMGemmPass") == 2 and m.matches(NAME) == 1
    assert before["aten.mm"] == 2 and after["aten.mm"] == 0
    assert after["compiled_llm.small_m_mm"] == 1 and after["compiled_llm.small_m_mm_silu_mul"] == 1
    assert after["compiled_llm.silu_and_mul"] == 0
    torch.testing.assert_close(out, _mlp(*args), rtol=0, atol=0)  # CPU: silu * up, then mm


def test_activation_with_another_reader_stays():
    out, _, after, m = capture_run(_shared, _args(), FORCED)
    assert m.matches(NAME) == 0 and after["compiled_llm.silu_and_mul"] == 1
    assert after["compiled_llm.small_m_mm"] == 2 and after["compiled_llm.small_m_mm_silu_mul"] == 0
    for o, r in zip(out, _shared(*_args())):
        torch.testing.assert_close(o, r, rtol=0, atol=0)


@pytest.mark.parametrize("config", [
    PassConfig(inline_fused_ops=False),  # small-M is CUDA-only by default
    PassConfig(small_m_gemm_on_cpu=True, enable_small_m_silu_mul=False, inline_fused_ops=False,
               enable_silu_mul_small_m=False),
    PassConfig(small_m_gemm_on_cpu=True, enable_small_m_silu_mul=False,
               inline_fused_ops=False),  # opt-in (call 35)
])
def test_off_by_default_on_cpu_and_by_its_flag(config):
    _, _, after, m = capture_run(_mlp, _args(), config)
    assert m.matches(NAME) == 0 and after["compiled_llm.small_m_mm_silu_mul"] == 0
    assert after["compiled_llm.silu_and_mul"] == 1


def test_o0_turns_it_off():
    from compiled_llm.optimization import LEVELS

    assert LEVELS[0].passes["enable_silu_mul_small_m"] is False


def test_through_inductor_no_silu_mul_kernel():
    args = _args(torch.bfloat16, tokens=3)
    config = PassConfig(small_m_gemm_on_cpu=True, enable_small_m_silu_mul=False,
                        enable_silu_mul_small_m=True)
    out, code, m = compile_run(_mlp, args, config)
    assert m.matches(NAME) == 1 and "compiled_llm.small_m_mm_silu_mul" in code
    assert not kernels_with(code, "exp")  # no generated kernel computes the SiLU
    torch.testing.assert_close(out, _mlp(*args), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_model_layers_down_projection_takes_the_activation(name):
    model = load_model(make_checkpoint(name), torch.float32, torch.device("cpu"), 512)
    ref, out, _, after, m = capture_model(model, 10, FORCED)
    assert m.matches(NAME) == LAYERS and after["compiled_llm.small_m_mm_silu_mul"] == LAYERS
    assert after["compiled_llm.silu_and_mul"] == 0
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_model_piece_through_inductor_has_no_silu_kernel():
    from tests.passes.helpers import run_model

    model = load_model(make_checkpoint("qwen3"), torch.float32, torch.device("cpu"), 512)
    ref, _, _ = run_model(model, 6, False)
    config = PassConfig(small_m_gemm_on_cpu=True, enable_small_m_silu_mul=False,
                        enable_silu_mul_small_m=True)
    out, code, m = run_model(model, 6, config)
    assert m.matches(NAME) == LAYERS
    assert code.count("compiled_llm.small_m_mm_silu_mul") >= LAYERS
    assert not kernels_with(code, "exp")  # the layers' SiLU runs inside the fused op only
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_fp8_mlps_are_not_matched():
    model = load_model(make_checkpoint("qwen3"), torch.float32, torch.device("cpu"), 512,
                       quantization="fp8")
    _, _, _, after, m = capture_model(model, 10, FORCED)
    assert m.matches(NAME) == 0 and after["compiled_llm.small_m_mm_silu_mul"] == 0
