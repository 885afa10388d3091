"""Quantized kernels on the GPU at Llama-3-8B shapes against their torch references (W4A16
Triton GEMM and split-K GEMV, block-FP8 Triton, INT8 `_int_mm`, FP8 `_scaled_mm`), and the
quantized checkpoints compiled with CUDA graphs against the dequantized model."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.passes.quant_ops import quant_fp8_ref
from compiled_llm.quantization.fp8 import fp8_gemm
from compiled_llm.quantization.packing import pack_int4
from compiled_llm.quantization.w4a16 import w4a16_gemm, w4a16_reference
from compiled_llm.quantization.w8a8 import (
    fp8_block_gemm,
    fp8_block_reference,
    int8_gemm,
    quant_fp8_static,
    quant_int8_ref,
)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
SHAPES = [(4096, 4096), (6144, 4096), (4096, 14336)]  # (N, K): qkv, o/gate-like, down


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.float(), ref.float()
    assert not out.isnan().any()
    return ((out - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("m", [1, 7, 16, 64, 333])
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_w4a16_triton_matches_reference(m, n, k):
    gen = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, k, device="cuda", generator=gen, dtype=torch.bfloat16)
    values = torch.randint(0, 16, (n, k), device="cuda", generator=gen, dtype=torch.uint8)
    scales = (torch.rand(n, k // 128, device="cuda", generator=gen) * 0.02).bfloat16()
    zeros = torch.randint(0, 16, (n, k // 128), device="cuda", generator=gen,
                          dtype=torch.uint8)
    perm = torch.randperm(k, device="cuda") if m == 7 else None
    args = (x, pack_int4(values), scales, zeros, perm, None, 128)
    ref = w4a16_reference(*(a.float() if a is x else a for a in args)).float()
    assert _rel_err(w4a16_gemm(*args), ref) < 1e-2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("m", "n", "group", "block_n", "split", "warps"), [
    (1, 28672, 128, 64, 4, 4), (1, 28672, 128, 128, 1, 4), (4, 28672, 128, 256, 2, 8),
    (16, 28672, 128, 128, 8, 8), (33, 28672, 128, 64, 1, 4), (3, 6184, 64, 128, 2, 4),
    (16, 6184, 32, 64, 1, 4)])
def test_w4a16_paired_mma_matches_reference(m, n, group, block_n, split, warps, dtype):
    """The MMA tiles' 16-bit path (inline-asm pair dequantization) at the 8B gate/up shape and
    at an N no tile divides (6,184), with groups of 128, 64 and 32."""
    from compiled_llm.quantization.kernels.w4a16 import W4A16Config, w4a16_gemm_triton

    k = 4096
    gen = torch.Generator(device="cuda").manual_seed(m + block_n + group)
    x = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
    values = torch.randint(0, 16, (n, k), device="cuda", generator=gen, dtype=torch.uint8)
    scales = (torch.rand(n, k // group, device="cuda", generator=gen) * 0.02).to(dtype)
    zeros = torch.randint(0, 16, (n, k // group), device="cuda", generator=gen,
                          dtype=torch.uint8)
    qweight = pack_int4(values)
    block_k = min(group, 128)
    config = W4A16Config(16 if m <= 16 else 64, block_n, block_k, split, warps, num_stages=3)
    out = w4a16_gemm_triton(x, qweight, scales, zeros, group, config)
    ref = w4a16_reference(x.float(), qweight, scales.float(), zeros, None, None, group)
    assert out.dtype == dtype and out.shape == (m, n) and _rel_err(out, ref) < 5e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_w4a16_paired_mma_is_exact_per_nibble(dtype):
    """q - z exactly for every (q, z) in every row: one-hot x over every column, unit scales,
    rows that differ (a wrong row stride shows), N not a multiple of the tile."""
    from compiled_llm.quantization.kernels.w4a16 import W4A16Config, w4a16_gemm_triton

    n, k, group = 200, 256, 16
    rows = torch.arange(n, device="cuda")[:, None]
    values = ((rows + torch.arange(k, device="cuda")[None, :]) % 16).to(torch.uint8)
    zeros = ((5 * rows + torch.arange(k // group, device="cuda")[None, :]) % 16).to(torch.uint8)
    scales = torch.ones(n, k // group, device="cuda", dtype=dtype)
    x = torch.eye(k, device="cuda", dtype=dtype)
    out = w4a16_gemm_triton(x, pack_int4(values), scales, zeros, group,
                            W4A16Config(16, 64, 16, 1, num_stages=3))
    want = values.float() - zeros.repeat_interleave(group, 1).float()
    assert torch.equal(out.float(), want.t())


@pytest.mark.parametrize("m", [1, 16, 200])
@pytest.mark.parametrize(("n", "k"), SHAPES[:2])
def test_block_fp8_triton_matches_reference(m, n, k):
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    scale = torch.rand(n, k // 128, device="cuda") * 0.01
    ref = fp8_block_reference(x.cpu(), weight.cpu(), scale.cpu(), None)
    assert _rel_err(fp8_block_gemm(x, weight, scale, None).cpu(), ref) < 1e-2


@pytest.mark.parametrize("m_major", [False, True])
@pytest.mark.parametrize("m", [1, 7, 300])
def test_fp8_group_quant_kernel_is_torchs(m, m_major):
    """The one-launch activation quantization gives quant_fp8_groups' bytes and scales."""
    from compiled_llm.quantization.fp8_groups import quant_fp8_groups
    from compiled_llm.quantization.kernels.fp8_block import quant_fp8_groups_triton

    x = torch.randn(m, 4096 + 384, device="cuda", dtype=torch.bfloat16) * 3
    q, scale = quant_fp8_groups_triton(x, m_major=m_major)
    want_q, want_scale = quant_fp8_groups(x)
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(scale, want_scale)


@pytest.mark.parametrize(("static", "zero_point"), [(False, None), (True, None), (True, -20.0)])
@pytest.mark.parametrize("m", [1, 16, 17, 300])
def test_int8_int_mm_matches_reference(m, static, zero_point):
    """Per-token activations, or static ones (int8_gemm quantizes them, with a zero point)."""
    x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    w_q = torch.randint(-127, 128, (1024, 4096), device="cuda", dtype=torch.int8)
    w_scale = torch.rand(1024, 1, device="cuda") * 1e-3
    q, x_scale = (x, torch.tensor([0.03], device="cuda")) if static else quant_int8_ref(x)
    zp = None if zero_point is None else torch.tensor([zero_point], device="cuda")
    out = int8_gemm(q, x_scale, w_q, w_scale, None, torch.bfloat16, zp)
    ref = int8_gemm(q.cpu(), x_scale.cpu(), w_q.cpu(), w_scale.cpu(), None, torch.float32,
                    None if zp is None else zp.cpu())
    assert _rel_err(out.cpu(), ref) < 1e-2


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("m", [1, 64])
def test_fp8_scaled_mm_matches_reference(m, static):
    x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    w_q = torch.randn(1024, 4096, device="cuda").to(torch.float8_e4m3fn)
    w_scale = torch.rand(1024, 1, device="cuda") * 1e-2
    scale = torch.tensor([0.02], device="cuda")
    q, x_scale = quant_fp8_static(x, scale) if static else quant_fp8_ref(x)
    out = fp8_gemm(q, x_scale, w_q, w_scale, None, torch.bfloat16)  # torch._scaled_mm
    ref = fp8_gemm(q.cpu(), x_scale.cpu(), w_q.cpu(), w_scale.cpu(), None, torch.float32)
    assert _rel_err(out.cpu(), ref) < 1e-2


@pytest.mark.parametrize("kind", ["gptq_act_order", "gptq_asym", "gptq_asym_v2",
                                  "gptq_channel", "awq", "ct_W4A16", "ct_W4A16_ASYM",
                                  "ct_W4A16_CHANNEL", "fp8_block", "ct_FP8_BLOCK",
                                  "ct_FP8_DYNAMIC", "ct_FP8", "ct_W8A8", "ct_W8A8_STATIC",
                                  "ct_W8A8_STATIC_ASYM", "fp8_tensor_static",
                                  "fp8_tensor_dynamic"])
def test_compiled_cuda_graphs_match_dequantized(kind):
    from compiled_llm import LLM, SamplingParams
    from tests.quantization.packers import packed_pair
    from tests.quantization.test_checkpoints import W8A8_ATOL, _prompt_logprobs
    from tests.utils import random_prompts

    quantized, reference = packed_pair(kind)
    llm = LLM(str(quantized), dtype="float32", engine_core_process=False)
    prompts = random_prompts(3, llm.engine.model_config.vocab_size, seed=5)
    got, expected = _prompt_logprobs(llm, reference, prompts)
    torch.testing.assert_close(got, expected, atol=W8A8_ATOL, rtol=0.01)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    assert all(len(o.outputs[0].token_ids) == 8 for o in llm.generate(
        [{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False))
    assert llm.engine.num_used_blocks == 0
