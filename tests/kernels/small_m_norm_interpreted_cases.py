"""The small-M GEMM with the residual add + RMSNorm in its prologue (compiled_llm/gemm/prologue.py)
against the two kernels it replaces (sum_add_rms_norm, then the small-M GEMM or its GATE_UP
epilogue): the sum bit for bit, the products within float32 rounding, over 1 and 3 rows, split-K
partials or one product, split-K in the second GEMM, the CUDA-core and MMA variants, bf16; rows
too wide refused. Run by test_interpreter.py under TRITON_INTERPRET=1."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.attention.kernels import kernels_interpreted
from compiled_llm.gemm.epilogue import sum_add_rms_norm
from compiled_llm.gemm.kernels import small_m_gate_up_silu_mul_triton, small_m_mm_triton
from compiled_llm.gemm.prologue import norm_prologue_fits, small_m_norm_mm_triton
from compiled_llm.gemm.tuning import SmallMConfig

pytestmark = pytest.mark.skipif(not kernels_interpreted(), reason="needs TRITON_INTERPRET=1")


def _inputs(splits: int, m: int, k: int, n: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    partials = torch.randn(splits, m, k, generator=gen)
    residual = torch.randn(m, k, generator=gen).to(dtype)
    norm_weight = (1 + 0.1 * torch.randn(k, generator=gen)).to(dtype)
    weight = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype)
    return partials, residual, norm_weight, weight


def _two_kernels(partials, residual, norm_weight, weight, config, gate_up):
    normed, summed = sum_add_rms_norm(partials, residual, norm_weight, 1e-6)
    gemm = small_m_gate_up_silu_mul_triton if gate_up else small_m_mm_triton
    return gemm(normed, weight, config), summed


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("splits_in", [1, 4])
@pytest.mark.parametrize("config", [
    SmallMConfig(block_n=16, block_k=32, split_k=1, use_dot=True),
    SmallMConfig(block_n=8, block_k=16, split_k=3, num_stages=1),
])
def test_prologue_equals_the_two_kernels(m, splits_in, config):
    partials, residual, norm_weight, weight = _inputs(splits_in, m, 64, 40, torch.float32, m)
    out, summed = small_m_norm_mm_triton(partials, residual, norm_weight, 1e-6, weight, config)
    ref, ref_summed = _two_kernels(partials, residual, norm_weight, weight, config, False)
    assert torch.equal(summed, ref_summed)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prologue_with_the_gate_up_epilogue(dtype):
    partials, residual, norm_weight, weight = _inputs(4, 2, 32, 48, dtype, 5)
    config = SmallMConfig(block_n=16, block_k=16, split_k=1, use_dot=True)
    out, summed = small_m_norm_mm_triton(partials, residual, norm_weight, 1e-6, weight, config,
                                         gate_up=True)
    ref, ref_summed = _two_kernels(partials, residual, norm_weight, weight, config, True)
    assert out.shape == (2, 24) and torch.equal(summed, ref_summed)
    torch.testing.assert_close(out, ref, rtol=2e-2 if dtype == torch.bfloat16 else 1e-5,
                               atol=2e-2 if dtype == torch.bfloat16 else 1e-5)


def test_rows_too_wide_are_refused():
    assert norm_prologue_fits(1, 4096) and norm_prologue_fits(4, 1024)
    assert not norm_prologue_fits(8, 1024) and not norm_prologue_fits(2, 4096)
    partials, residual, norm_weight, weight = _inputs(1, 8, 1024, 16, torch.float32)
    with pytest.raises(ValueError, match="norm prologue"):
        small_m_norm_mm_triton(partials, residual, norm_weight, 1e-6, weight,
                               SmallMConfig(block_n=16, block_k=32))
