"""The FP8 W8A8 path: load-time Fp8Linear transform, its numerics, and an engine run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from compiled_llm import LLM, SamplingParams
from compiled_llm.passes.quant_ops import FP8_DTYPE, quant_fp8_ref
from compiled_llm.quantization import Fp8Linear, quantize_model
from compiled_llm.worker.loader import load_model
from tests.utils import make_checkpoint, random_prompts


def test_quant_per_token_round_trip():
    x = torch.randn(9, 64) * torch.logspace(-3, 3, 9)[:, None]  # rows of very different range
    q, s = quant_fp8_ref(x)
    assert q.dtype == FP8_DTYPE and s.shape == (9, 1)
    rel = ((q.float() * s - x).abs().amax(-1) / x.abs().amax(-1))
    assert rel.max() < 0.07  # e4m3: 3 mantissa bits, per-row scale


def test_fp8_linear_close_to_bf16_linear():
    torch.manual_seed(0)
    lin = nn.Linear(64, 48, bias=True).to(torch.bfloat16)
    f = Fp8Linear(lin)
    assert f.weight.dtype == FP8_DTYPE and f.weight_scale.shape == (48, 1)
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16)
    ref, out = lin(x), f(x)
    assert out.shape == ref.shape and out.dtype == torch.bfloat16
    assert (out - ref).float().norm() / ref.float().norm() < 0.05


def test_quantize_model_swaps_linears_but_not_lm_head():
    model = load_model(make_checkpoint("qwen3"), torch.bfloat16, torch.device("cpu"), 512,
                       quantization="fp8")
    projections = [m for n, m in model.named_modules() if n.endswith("_proj")]
    assert projections and all(isinstance(m, Fp8Linear) for m in projections)
    assert type(model.lm_head).__name__ == "LMHead"
    with pytest.raises(ValueError, match="quantization"):
        quantize_model(model, "int3")


def test_engine_generates_with_fp8():
    ckpt = make_checkpoint("llama")
    prompts = [{"prompt_token_ids": p} for p in random_prompts(3, 300, seed=1)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    ref = LLM(str(ckpt), enforce_eager=True, dtype="float32")
    fp8 = LLM(str(ckpt), enforce_eager=True, dtype="float32", quantization="fp8")
    a = [o.outputs[0].token_ids for o in ref.generate(prompts, params, use_tqdm=False)]
    b = [o.outputs[0].token_ids for o in fp8.generate(prompts, params, use_tqdm=False)]
    assert all(len(t) == 6 for t in b)
    # random tiny weights: most greedy tokens survive W8A8 rounding
    same = sum(x == y for ra, rb in zip(a, b) for x, y in zip(ra, rb))
    assert same >= 0.5 * sum(map(len, a))
    assert fp8.engine.num_used_blocks == 0
    with pytest.raises(ValueError, match="quantization"):
        LLM(str(ckpt), enforce_eager=True, quantization="int4")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (torch._scaled_mm)")
def test_scaled_mm_matches_reference_gemm():
    from compiled_llm.quantization.fp8 import fp8_gemm, quantize_weight

    x = torch.randn(32, 256, device="cuda", dtype=torch.bfloat16)
    w_q, w_s = quantize_weight(torch.randn(128, 256, device="cuda", dtype=torch.bfloat16))
    q, s = quant_fp8_ref(x)
    out = fp8_gemm(q, s, w_q, w_s, None, torch.bfloat16)  # torch._scaled_mm
    ref = fp8_gemm(q.cpu(), s.cpu(), w_q.cpu(), w_s.cpu(), None, torch.bfloat16)  # reference
    torch.testing.assert_close(out.cpu(), ref, rtol=2e-2, atol=2e-2)
