"""The W4A16 and block-FP8 Triton GEMMs (and their split-K GEMV paths) against the torch
references, run by test_interpreter.py in a subprocess with TRITON_INTERPRET=1 (CPU tensors,
small shapes)."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.attention.kernels import kernels_interpreted
from compiled_llm.quantization.kernels.fp8_block import fp8_block_gemm_triton
from compiled_llm.quantization.kernels.w4a16 import W4A16Config, w4a16_gemm_triton
from compiled_llm.quantization.packing import pack_int4
from compiled_llm.quantization.w4a16 import w4a16_reference
from compiled_llm.quantization.w8a8 import fp8_block_reference

pytestmark = pytest.mark.skipif(not kernels_interpreted(), reason="needs TRITON_INTERPRET=1")
TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3}


def w4a16_inputs(m: int, n: int, k: int, group: int, dtype: torch.dtype, seed: int = 0):
    """x [m, k], packed weight [n, k / 8], scales and zeros [n, k / group]."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype)
    values = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(n, k // group, generator=gen) * 0.02 + 0.005).to(dtype)
    zeros = torch.randint(0, 16, (n, k // group), generator=gen, dtype=torch.uint8)
    return x, pack_int4(values), scales, zeros


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("m", "n", "k", "group"), [(1, 48, 256, 128), (5, 64, 128, 32),
                                                    (33, 40, 256, 64)])
def test_matches_reference(m, n, k, group, dtype):
    x, qweight, scales, zeros = w4a16_inputs(m, n, k, group, dtype, seed=m + n)
    out = w4a16_gemm_triton(x, qweight, scales, zeros, group)
    ref = w4a16_reference(x, qweight, scales, zeros, None, None, group)
    assert out.dtype == dtype and out.shape == (m, n)
    scale = max(1.0, ref.float().abs().max().item())
    assert (out.float() - ref.float()).abs().max().item() <= TOLERANCE[dtype] * scale


def test_split_k_partials_add_up():
    x, qweight, scales, zeros = w4a16_inputs(3, 32, 256, 32, torch.float32, seed=7)
    ref = w4a16_reference(x, qweight, scales, zeros, None, None, 32)
    for split, expand in ((1, False), (3, True), (8, False)):  # 3: the last split is short
        config = W4A16Config(16, 16, 32, split, num_stages=1, expand=expand)
        torch.testing.assert_close(w4a16_gemm_triton(x, qweight, scales, zeros, 32, config),
                                   ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("m", "block_k", "split"), [(1, 32, 1), (3, 64, 3), (4, 128, 2)])
def test_gemv_rows_match_reference(m, block_k, split):
    """The GEMV variant: tiles of one group, of two (scales and zeros per word), a short split."""
    x, qweight, scales, zeros = w4a16_inputs(m, 24, 256, 32, torch.float32, seed=m)
    config = W4A16Config(m, 16, block_k, split, num_stages=1, gemv=True)
    torch.testing.assert_close(w4a16_gemm_triton(x, qweight, scales, zeros, 32, config),
                               w4a16_reference(x, qweight, scales, zeros, None, None, 32),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("m", [3, 40])
def test_fp8_block_matches_reference(m):
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, 256, generator=gen)
    weight = torch.randn(72, 256, generator=gen).to(torch.float8_e4m3fn)
    scale = torch.rand(72, 2, generator=gen) * 0.01
    torch.testing.assert_close(fp8_block_gemm_triton(x, weight, scale),
                               fp8_block_reference(x, weight, scale, None), rtol=1e-4, atol=1e-5)
