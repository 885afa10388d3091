"""SmallMGemmSiluMulFusionPass with small-M forced on the CPU: silu_and_mul over the two halves of
one small_m_mm (the fused gate/up projection) becomes `compiled_llm::small_m_gate_up_silu_mul`
(toy graph, Llama/Qwen3 layers, through Inductor with no SiLU kernel left); a product with
another reader, uneven halves and FP8 MLPs stay; the prologue fusion, when asked for too, wins;
opt-in (-O0 and the flag's default leave it off); outputs match the unfused path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from compiled_llm.passes import PassConfig
from compiled_llm.worker.loader import load_model
from tests.passes.helpers import capture_model, capture_run, compile_run, kernels_with
from tests.utils import make_checkpoint

FORCED = PassConfig(small_m_gemm_on_cpu=True, inline_fused_ops=False,
                    enable_small_m_silu_mul=True,
                    enable_small_m_norm_prologue=False)  # its own test: test_small_m_norm_gemm
FORCED_INDUCTOR = PassConfig(small_m_gemm_on_cpu=True, enable_small_m_silu_mul=True)
NAME = "SmallMGemmSiluMulFusionPass"
FUSED = "compiled_llm.small_m_gate_up_silu_mul"
LAYERS = 2  # tests/utils.py SMALL


def _gate_up(x, w_gate_up):
    gate, up = (x @ w_gate_up.t()).chunk(2, dim=-1)
    return F.silu(gate) * up


def _shared(x, w_gate_up):
    product = x @ w_gate_up.t()
    gate, up = product.chunk(2, dim=-1)
    return F.silu(gate) * up, product.sum(-1)  # the product has another reader: not fused


def _uneven(x, w_gate_up):
    product = x @ w_gate_up.t()
    return F.silu(product[:, :40]) * product[:, 56:]  # not the two halves


def _args(dtype=torch.float32, tokens=5):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(*s, generator=g) / s[-1] ** 0.5).to(dtype)
            for s in ((tokens, 32), (96, 32))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_toy_gate_up_takes_the_silu_mul(dtype):
    args = _args(dtype)
    out, before, after, m = capture_run(_gate_up, args, FORCED)
    assert m.matches("SmallMGemmPass") == 1 and m.matches(NAME) == 1
    assert before["aten.mm"] == 1 and after[FUSED] == 1
    assert after["compiled_llm.small_m_mm"] == 0 and after["compiled_llm.silu_and_mul"] == 0
    assert after["aten.slice"] == 0
    torch.testing.assert_close(out, _gate_up(*args), rtol=0, atol=0)  # CPU: mm, silu * up


@pytest.mark.parametrize("fn", [_shared, _uneven])
def test_other_readers_and_uneven_halves_stay(fn):
    out, _, after, m = capture_run(fn, _args(), FORCED)
    assert m.matches(NAME) == 0 and after[FUSED] == 0 and after["compiled_llm.small_m_mm"] == 1
    for o, r in zip(out if isinstance(out, tuple) else (out,),
                    (fn(*_args()),) if fn is _uneven else fn(*_args())):
        torch.testing.assert_close(o, r, rtol=0, atol=0)


@pytest.mark.parametrize("config", [
    PassConfig(inline_fused_ops=False, enable_small_m_silu_mul=True),  # small-M: CUDA only
    PassConfig(small_m_gemm_on_cpu=True, inline_fused_ops=False,
               enable_small_m_silu_mul=False),  # its flag
])
def test_off_on_cpu_by_default_and_by_its_flag(config):
    _, _, after, m = capture_run(_gate_up, _args(), config)
    assert m.matches(NAME) == 0 and after[FUSED] == 0
    assert after["compiled_llm.silu_and_mul"] == 1


def test_o0_turns_it_off():
    from compiled_llm.optimization import LEVELS

    assert LEVELS[0].passes["enable_small_m_silu_mul"] is False
    assert PassConfig().enable_small_m_silu_mul is True


def test_through_inductor_no_silu_kernel():
    args = _args(torch.bfloat16, tokens=3)
    out, code, m = compile_run(_gate_up, args, FORCED_INDUCTOR)
    assert m.matches(NAME) == 1 and FUSED in code
    assert not kernels_with(code, "exp")  # no generated kernel computes the SiLU
    torch.testing.assert_close(out, _gate_up(*args), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_model_layers_gate_up_takes_the_silu_mul(name):
    model = load_model(make_checkpoint(name), torch.float32, torch.device("cpu"), 512)
    ref, out, _, after, m = capture_model(model, 10, FORCED)
    assert m.matches(NAME) == LAYERS and after[FUSED] == LAYERS
    assert after["compiled_llm.silu_and_mul"] == 0
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_the_opt_in_prologue_fusion_wins():
    model = load_model(make_checkpoint("qwen3"), torch.float32, torch.device("cpu"), 512)
    config = PassConfig(small_m_gemm_on_cpu=True, inline_fused_ops=False,
                        enable_silu_mul_small_m=True, enable_small_m_silu_mul=True)
    _, _, _, after, m = capture_model(model, 10, config)
    assert m.matches(NAME) == 0 and after[FUSED] == 0
    assert after["compiled_llm.small_m_mm_silu_mul"] == LAYERS


def test_fp8_mlps_are_not_matched():
    model = load_model(make_checkpoint("qwen3"), torch.float32, torch.device("cpu"), 512,
                       quantization="fp8")
    _, _, _, after, m = capture_model(model, 10, FORCED)
    assert m.matches(NAME) == 0 and after[FUSED] == 0


def _half_read_twice(x, w_gate_up):
    gate, up = (x @ w_gate_up.t()).chunk(2, dim=-1)
    return F.silu(gate) * up, gate.sum(-1)  # gate has a second reader: not fused


def _strided_halves(x, w_gate_up):
    product = x @ w_gate_up.t()
    return F.silu(product[:, 0:48:2]) * product[:, 48:96:2]


@pytest.mark.parametrize("fn", [_half_read_twice, _strided_halves])
def test_a_half_read_twice_and_strided_halves_stay(fn):
    out, _, after, m = capture_run(fn, _args(), FORCED)
    assert m.matches(NAME) == 0 and after[FUSED] == 0
    ref = fn(*_args())
    for o, r in zip(out if isinstance(out, tuple) else (out,),
                    ref if isinstance(ref, tuple) else (ref,)):
        torch.testing.assert_close(o, r, rtol=0, atol=0)
