"""The small-M GEMM's epilogues against the unfused path, under TRITON_INTERPRET=1 (run by
test_interpreter.py): the split-K sum + residual add + RMSNorm (epilogue.py; summed bit-equal,
normed close; a finished product, strided residual rows, bad shapes), the GATE_UP SiLU·mul
(kernels.py) and its fallback kernel against Inductor's SiLU·mul of the products."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compiled_llm.attention.kernels import kernels_interpreted
from compiled_llm.gemm.epilogue import silu_mul_halves, sum_add_rms_norm
from compiled_llm.gemm.kernels import (
    small_m_gate_up_silu_mul_triton,
    small_m_mm_partials,
    small_m_mm_triton,
)
from compiled_llm.gemm.ops import rms_norm_reference
from compiled_llm.gemm.tuning import SmallMConfig, gate_up_from_plain

pytestmark = pytest.mark.skipif(not kernels_interpreted(), reason="needs TRITON_INTERPRET=1")

EPS = 1e-6
TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3),
              torch.bfloat16: (2e-2, 2e-2)}


def _inputs(m: int, n: int, k: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype)
    weight = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype)
    residual = torch.randn(m, n, generator=gen).to(dtype)
    norm_weight = (1 + 0.1 * torch.randn(n, generator=gen)).to(dtype)
    return x, weight, residual, norm_weight


def _check(normed, summed, product, residual, norm_weight):
    """summed bit-equal to product + residual (eager), normed close to the models' norm."""
    summed_ref = product + residual
    assert torch.equal(summed, summed_ref)
    ref = rms_norm_reference(summed_ref, norm_weight, EPS)
    assert normed.dtype == ref.dtype and normed.shape == ref.shape
    rtol, atol = TOLERANCES[residual.dtype]
    torch.testing.assert_close(normed.float(), ref.float(), rtol=rtol, atol=atol)


# bfloat16 is left to the GPU test: the interpreter truncates float32 to bfloat16
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("split_k", [1, 4])
@pytest.mark.parametrize(("n", "k"), [(64, 256), (40, 200)])
def test_split_k_sum_adds_and_normalizes_like_the_unfused_path(dtype, m, split_k, n, k):
    x, weight, residual, norm_weight = _inputs(m, n, k, dtype, seed=m * n + split_k)
    config = SmallMConfig(block_n=16, block_k=32, split_k=split_k)
    partials = small_m_mm_partials(x, weight, config)
    assert partials.shape == (split_k, m, n)
    assert partials.dtype == (torch.float32 if split_k > 1 else dtype)
    normed, summed = sum_add_rms_norm(partials, residual, norm_weight, EPS)
    _check(normed, summed, small_m_mm_triton(x, weight, config), residual, norm_weight)


def test_a_finished_product_and_strided_residual_rows():
    x, weight, residual, norm_weight = _inputs(5, 48, 64, torch.float32, seed=3)
    product = torch.mm(x, weight.t())
    wide = torch.zeros(5, 80)
    wide[:, 16:64] = residual
    normed, summed = sum_add_rms_norm(product.unsqueeze(0), wide[:, 16:64], norm_weight, EPS)
    _check(normed, summed, product, residual, norm_weight)


def test_a_float32_norm_weight_gives_float32_normed():
    x, weight, residual, norm_weight = _inputs(2, 32, 64, torch.float16, seed=4)
    product = torch.mm(x, weight.t())
    normed, summed = sum_add_rms_norm(product.unsqueeze(0), residual, norm_weight.float(), EPS)
    assert normed.dtype == torch.float32 and summed.dtype == torch.float16
    _check(normed, summed, product, residual, norm_weight.float())


def test_mismatched_residual_raises():
    x, weight, residual, norm_weight = _inputs(3, 32, 64, torch.float32, seed=5)
    with pytest.raises(ValueError, match="does not fit"):
        sum_add_rms_norm(torch.mm(x, weight.t()).unsqueeze(0), residual[:2], norm_weight, EPS)


def _inductor_silu_mul(product: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of product's halves as Inductor's kernel computes it (float32, rounded
    once); exp is numpy's, as the interpreter's."""
    gate, up = (half.float() for half in product.chunk(2, dim=-1))
    exp = torch.from_numpy(np.exp(-gate.numpy()))
    return (gate / (exp + 1.0) * up).to(product.dtype)


# bfloat16 with use_dot: the interpreter's tl.dot gets it wrong (small_m_gemm_interpreted_cases)
@pytest.mark.parametrize(("use_dot", "dtype"), [(False, torch.float32), (False, torch.float16),
                                                (True, torch.float16), (True, torch.float32)])
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("width", [72, 64])
def test_gate_up_epilogue_is_the_product_then_silu_mul(use_dot, dtype, m, width):
    """silu(x @ gate^T) * (x @ up^T) [M, I] from W [2I, K]: the plain kernel's products, rounded,
    then Inductor's SiLU·mul; the config's block_n is gate rows a program (16 of 72: a ragged
    last block), the plain product's grid at twice that (tuning.gate_up_from_plain)."""
    x, weight, _, _ = _inputs(m, 2 * width, 200, dtype, seed=m + width)
    plain = SmallMConfig(block_n=32, block_k=32, use_dot=use_dot)
    out = small_m_gate_up_silu_mul_triton(x, weight, gate_up_from_plain(plain))
    assert out.shape == (m, width) and out.dtype == dtype
    ref = _inductor_silu_mul(small_m_mm_triton(x, weight, plain))
    rtol, atol = TOLERANCES[dtype]
    torch.testing.assert_close(out.float(), ref.float(), rtol=rtol, atol=atol)
    assert torch.equal(out, ref) or use_dot  # numpy's matmul may order the dot's sums apart


def test_gate_up_epilogue_refuses_split_k_and_odd_widths():
    x, weight, _, _ = _inputs(2, 64, 64, torch.float32, seed=1)
    with pytest.raises(ValueError, match="split_k 1"):
        small_m_gate_up_silu_mul_triton(x, weight, SmallMConfig(16, 32, split_k=2))
    with pytest.raises(ValueError, match="even N"):
        small_m_gate_up_silu_mul_triton(x, weight[:63], SmallMConfig(16, 32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rows", [0, 1, 5])
def test_silu_mul_halves_is_inductors_silu_mul(dtype, rows):
    gen = torch.Generator().manual_seed(rows)
    product = (torch.randn(rows, 2 * 1100, generator=gen) * 3).to(dtype)
    out = silu_mul_halves(product)
    assert out.shape == (rows, 1100)
    assert torch.equal(out, _inductor_silu_mul(product))
