"""The W4A16 GEMV on a GPU (skipped without one): through the op with the small-M override at the
8B fused layer shapes, 1 to 4 tokens, bf16 and fp16 activations, act-order perm and bias, beside
tinygemm's result for the same weight; the built-in and a K-split launch directly."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.quantization import tinygemm
from compiled_llm.quantization.kernels import w4a16_tuning
from compiled_llm.quantization.kernels.w4a16 import W4A16Config, w4a16_gemm_triton
from compiled_llm.quantization.packing import pack_int4
from compiled_llm.quantization.w4a16 import w4a16_gemm, w4a16_reference

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
pytestmark = [pytest.mark.gpu, needs_cuda]


def _weight(n: int, k: int, group: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    values = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(n, k // group, generator=gen) * 0.02 + 0.002).bfloat16()
    zeros = torch.randint(0, 16, (n, k // group), generator=gen, dtype=torch.uint8)
    return pack_int4(values).cuda(), scales.cuda(), zeros.cuda()


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize(("n", "k"), [(6144, 4096), (4096, 14336)])
def test_op_on_the_gemv_matches_reference_and_tinygemm(m, n, k, monkeypatch):
    qweight, scales, zeros = _weight(n, k, 128, seed=m)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    perm = torch.randperm(k, device="cuda") if m % 2 else None
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    ref = w4a16_reference(x.float(), qweight, scales.float(), zeros, perm, bias.float(), 128)
    made = (tinygemm.pack_tinygemm(qweight), tinygemm.tinygemm_scales_zeros(scales, zeros))
    monkeypatch.setenv(w4a16_tuning.SMALL_M_ENV, "gemv")
    gemv = w4a16_gemm(x, qweight, scales, zeros, perm, bias, 128, *made)
    monkeypatch.setenv(w4a16_tuning.SMALL_M_ENV, "tinygemm")
    tiny = w4a16_gemm(x, qweight, scales, zeros, perm, bias, 128, *made)
    assert gemv.dtype == torch.bfloat16 and _rel_err(gemv, ref) < 1e-2
    assert _rel_err(gemv, tiny) < 2e-2
    monkeypatch.setenv(w4a16_tuning.SMALL_M_ENV, "gemv")
    half = w4a16_gemm(x.half(), qweight, scales.half(), zeros, perm, bias.half(), 128)
    assert half.dtype == torch.float16 and _rel_err(half, ref) < 1e-2


@pytest.mark.parametrize(("block_n", "block_k", "split", "warps"),
                         [(32, 256, 1, 4), (16, 512, 2, 4), (64, 128, 4, 8), (128, 128, 1, 8)])
def test_gemv_tiles_match_reference(block_n, block_k, split, warps):
    qweight, scales, zeros = _weight(4096, 4096, 64, seed=block_n)
    x = torch.randn(2, 4096, device="cuda", dtype=torch.bfloat16)
    ref = w4a16_reference(x.float(), qweight, scales.float(), zeros, None, None, 64)
    config = W4A16Config(2, block_n, block_k, split, warps, 1, gemv=True)
    assert _rel_err(w4a16_gemm_triton(x, qweight, scales, zeros, 64, config), ref) < 1e-2
