"""The add + RMSNorm in the next small-M GEMM's prologue on the GPU: the op
`small_m_mm_add_rms_norm_mm` against the two ops it replaces at the Qwen3-0.6B shapes (o then
gate/up, down then qkv) and Llama-3-8B's (o then qkv), rows that fit the prologue and rows past
it (the unfused fallback), the sum bit for bit; inside a CUDA graph replayed on new inputs."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.gemm import (
    small_m_gate_up_silu_mul,
    small_m_mm,
    small_m_mm_add_rms_norm,
    small_m_mm_add_rms_norm_mm,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
# (first weight [N, K], second weight, gate_up)
SHAPES = {"qwen3-0.6b o, gate_up": ((1024, 2048), (6144, 1024), True),
          "qwen3-0.6b down, qkv": ((1024, 3072), (4096, 1024), False),
          "llama3-8b o, qkv": ((4096, 4096), (6144, 4096), False)}


def _inputs(m: int, first, second, seed: int = 0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    n, k = first

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).to(torch.bfloat16)

    return (rand(m, k), rand(n, k, scale=k**-0.5), rand(m, n),
            1 + rand(n, scale=0.1), rand(*second, scale=n**-0.5))


def _unfused(x, weight, residual, norm_weight, weight2, gate_up):
    normed, summed = small_m_mm_add_rms_norm(x, weight, residual, norm_weight, 1e-6)
    return (small_m_gate_up_silu_mul if gate_up else small_m_mm)(normed, weight2), summed


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_pair_matches_the_two_ops(shape, m):
    first, second, gate_up = SHAPES[shape]
    x, weight, residual, norm_weight, weight2 = _inputs(m, first, second, m)
    out, summed = small_m_mm_add_rms_norm_mm(x, weight, residual, norm_weight, 1e-6, weight2,
                                             gate_up)
    ref, ref_summed = _unfused(x, weight, residual, norm_weight, weight2, gate_up)
    assert torch.equal(summed, ref_summed)
    assert out.shape == ref.shape and _rel_err(out, ref) < 5e-3


def test_pair_in_a_cuda_graph():
    first, second, gate_up = SHAPES["qwen3-0.6b down, qkv"]
    inputs = _inputs(1, first, second)
    static = [t.clone() for t in inputs]
    run = lambda: small_m_mm_add_rms_norm_mm(*static[:4], 1e-6, static[4], gate_up)  # noqa: E731
    run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, summed = run()
    for seed in (1, 2):
        fresh = _inputs(1, first, second, seed)
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
        ref, ref_summed = _unfused(*fresh[:4], fresh[4], gate_up)
        assert torch.equal(summed, ref_summed) and _rel_err(out, ref) < 5e-3
