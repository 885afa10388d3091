"""The small-M GEMM kernel (compiled_llm/gemm/kernels.py) against torch.mm: 1, 3 and 16 rows,
split-K 1 and > 1, N and K not multiples of the blocks, the CUDA-core and MMA variants; split-K in
one launch bit-equal to the two-kernel sum, its counters back at zero, repeated launches equal;
the GATED variant against eager silu * up then mm, bit-equal to Inductor's rounding then the
plain kernel; run by test_interpreter.py under TRITON_INTERPRET=1."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from compiled_llm.attention.kernels import kernels_interpreted
from compiled_llm.gemm import arrival, kernels
from compiled_llm.gemm.kernels import small_m_mm_silu_mul_triton, small_m_mm_triton
from compiled_llm.gemm.tuning import SmallMConfig

pytestmark = pytest.mark.skipif(not kernels_interpreted(), reason="needs TRITON_INTERPRET=1")

TOLERANCES = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (2e-2, 2e-2),
              torch.float16: (2e-3, 2e-3)}


@pytest.fixture(autouse=True)
def _one_launch(monkeypatch):
    """The opt-in one-launch split-K (COMPILED_LLM_ONE_LAUNCH_SPLITS=1) under test; the two-kernel
    default is what the fallback cases here run."""
    monkeypatch.setattr(arrival, "ONE_LAUNCH", True)


def _inputs(m: int, n: int, k: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype)
    weight = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype)
    return x, weight


def _check(x: torch.Tensor, weight: torch.Tensor, config: SmallMConfig) -> None:
    out = small_m_mm_triton(x, weight, config)
    ref = torch.mm(x.float(), weight.float().t()).to(x.dtype)
    assert out.shape == ref.shape and out.dtype == x.dtype
    rtol, atol = TOLERANCES[x.dtype]
    torch.testing.assert_close(out.float(), ref.float(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize(("n", "k"), [(64, 256), (40, 200)])
def test_cuda_core_variant_matches_mm(dtype, m, split_k, n, k):
    x, weight = _inputs(m, n, k, dtype, seed=m * n + k)
    _check(x, weight, SmallMConfig(block_n=16, block_k=32, split_k=split_k))


# the interpreter's tl.dot gets bfloat16 wrong (numpy has no bf16): half precision in its place;
# the GPU test (test_small_m_gemm_gpu.py) covers the MMA variant in bfloat16
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("split_k", [1, 4])
def test_mma_variant_matches_mm(dtype, m, split_k):
    x, weight = _inputs(m, 72, 136, dtype, seed=m)
    _check(x, weight, SmallMConfig(block_n=32, block_k=32, split_k=split_k, use_dot=True))


def test_more_splits_than_k_tiles_and_strided_rows():
    x, weight = _inputs(5, 24, 40, torch.float32, seed=7)
    wide = torch.zeros(5, 64)
    wide[:, :40] = x
    _check(wide[:, :40], weight, SmallMConfig(block_n=8, block_k=32, split_k=8))


def test_unsupported_launches_raise():
    x, weight = _inputs(17, 16, 32, torch.float32, seed=1)
    with pytest.raises(ValueError, match="1..16 rows"):
        small_m_mm_triton(x, weight, SmallMConfig(block_n=16, block_k=32))
    with pytest.raises(ValueError, match="block_n >= 16"):
        small_m_mm_triton(x[:2], weight, SmallMConfig(block_n=8, block_k=32, use_dot=True))


class _NoLaunch:
    def __getitem__(self, grid):
        raise AssertionError("split-K summed by a second kernel")


@pytest.mark.parametrize("use_dot", [False, True])
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("half", [False, True])
def test_split_k_sums_in_one_launch_like_two_kernels(monkeypatch, use_dot, m, half):
    """One launch (no sum_splits_kernel), bit-equal to the two-kernel path's split-order sum and
    to itself on a second launch (a graph replay), close to float32; the counters end at 0."""
    dtype = (torch.float16 if use_dot else torch.bfloat16) if half else torch.float32
    x, weight = _inputs(m, 80, 264, dtype, seed=11)
    config = SmallMConfig(block_n=16, block_k=32, split_k=4, use_dot=use_dot)
    with monkeypatch.context() as patch:
        patch.setitem(arrival._COUNTERS, x.device, torch.zeros(0, dtype=torch.int32))
        two_kernels = small_m_mm_triton(x, weight, config)  # no room for 5 counters: fallback
    with monkeypatch.context() as patch:
        patch.setattr(kernels, "sum_splits_kernel", _NoLaunch())
        first = small_m_mm_triton(x, weight, config)
        counters = kernels.split_counters(x.device)
        assert counters.shape == (kernels.COUNTERS,) and not counters.any()
        again = small_m_mm_triton(x, weight, config)
    assert torch.equal(first, two_kernels) and torch.equal(again, first)
    assert not counters.any()
    _check(x, weight, config)


def test_float32_split_k_matches_float32_reference(monkeypatch):
    monkeypatch.setattr(kernels, "sum_splits_kernel", _NoLaunch())
    x, weight = _inputs(2, 48, 512, torch.float32, seed=5)
    out = small_m_mm_triton(x, weight, SmallMConfig(block_n=16, block_k=64, split_k=8))
    torch.testing.assert_close(out, torch.mm(x.double(), weight.double().t()).float(),
                               rtol=1e-5, atol=1e-5)
    assert not kernels.split_counters(x.device).any()


def _gated_inputs(m: int, n: int, k: int, dtype: torch.dtype, seed: int):
    """gate and up as column views of one [m, 2k] tensor (the gate/up GEMM's output), W."""
    gen = torch.Generator().manual_seed(seed)
    gate_up = (torch.randn(m, 2 * k, generator=gen) * 3).to(dtype)
    weight = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype)
    return gate_up[:, :k], gate_up[:, k:], weight


def _inductor_silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up as Inductor's kernel computes it: g / (1 + exp(-g)) * u in float32,
    rounded once to the dtype (eager rounds silu's result first); exp is numpy's, as the
    interpreter's (on the GPU both take libdevice's)."""
    g = gate.float()
    exp = torch.from_numpy(np.exp(-g.numpy()))
    return (g / (exp + 1.0) * up.float()).to(gate.dtype)


# bfloat16 with use_dot: see test_mma_variant_matches_mm (half precision in its place)
@pytest.mark.parametrize(("use_dot", "dtype"), [(False, torch.bfloat16), (False, torch.float32),
                                                (True, torch.float16), (True, torch.float32)])
@pytest.mark.parametrize("split_k", [1, 4])
@pytest.mark.parametrize("m", [1, 3, 16])
def test_gated_matches_eager_silu_mul_then_mm(use_dot, dtype, split_k, m):
    gate, up, weight = _gated_inputs(m, 72, 200, dtype, seed=m + split_k)
    config = SmallMConfig(block_n=16 if not use_dot else 32, block_k=32, split_k=split_k,
                          use_dot=use_dot)
    out = small_m_mm_silu_mul_triton(gate, up, weight, config)
    ref = torch.mm((F.silu(gate) * up).float(), weight.float().t()).to(dtype)  # eager
    assert out.shape == (m, 72) and out.dtype == dtype
    rtol, atol = TOLERANCES[dtype]  # atol relative to the outputs' scale
    scale = ref.float().abs().max().item()
    torch.testing.assert_close(out.float(), ref.float(), rtol=rtol, atol=atol * scale)
    # bit-equal to the unfused path: Inductor's silu * up, then the same small-M kernel (not in
    # bfloat16 here: the interpreter truncates float32 to bfloat16; the GPU test checks it)
    unfused = small_m_mm_triton(_inductor_silu_mul(gate, up), weight, config)
    assert torch.equal(out, unfused) or dtype == torch.bfloat16
    assert not kernels.split_counters(gate.device).any()


def test_gated_activation_rounds_once_like_inductor():
    """With W = I the output is the activation itself: Inductor's rounding, bit for bit (float16:
    the interpreter rounds float32 to bfloat16 toward zero, the GPU to nearest)."""
    dtype = torch.float16
    gate, up, _ = _gated_inputs(16, 1, 64, dtype, seed=3)
    eye = torch.eye(64, dtype=dtype)
    out = small_m_mm_silu_mul_triton(gate, up, eye, SmallMConfig(block_n=16, block_k=32))
    assert torch.equal(out, _inductor_silu_mul(gate, up))
    assert not torch.equal(out, F.silu(gate) * up)  # eager's two roundings differ somewhere
