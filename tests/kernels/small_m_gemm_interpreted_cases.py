"""The small-M GEMM kernel (compiled_llm/gemm/kernels.py) against torch.mm: 1, 3 and 16 rows,
split-K 1 and > 1, N and K not multiples of the blocks, the CUDA-core and MMA variants; run by
test_interpreter.py under TRITON_INTERPRET=1."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.attention.kernels import kernels_interpreted
from compiled_llm.gemm.kernels import small_m_mm_triton
from compiled_llm.gemm.tuning import SmallMConfig

pytestmark = pytest.mark.skipif(not kernels_interpreted(), reason="needs TRITON_INTERPRET=1")

TOLERANCES = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (2e-2, 2e-2),
              torch.float16: (2e-3, 2e-3)}


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
