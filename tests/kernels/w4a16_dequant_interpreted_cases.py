"""The W4A16 dequantize kernel (prefill sizes) against packing.dequantize_int4 and the matmul
through it against w4a16_reference, run by test_interpreter.py under TRITON_INTERPRET=1."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.attention.kernels import kernels_interpreted
from compiled_llm.quantization.kernels.w4a16_dequant import dequantize_w4, w4a16_dequant_mm
from compiled_llm.quantization.packing import dequantize_int4
from compiled_llm.quantization.w4a16 import w4a16_reference
from tests.kernels.quant_interpreted_cases import w4a16_inputs

pytestmark = pytest.mark.skipif(not kernels_interpreted(), reason="needs TRITON_INTERPRET=1")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("n", "k", "group"), [(48, 256, 128), (40, 384, 32), (33, 136, 8)])
def test_dequantize_matches_reference(dtype, n, k, group):
    _, qweight, scales, zeros = w4a16_inputs(1, n, k, group, dtype, seed=n)
    out = dequantize_w4(qweight, scales, zeros, group, dtype)
    ref = dequantize_int4(qweight, scales, zeros, group)
    torch.testing.assert_close(out, ref, rtol=1e-3, atol=1e-5)


def test_matmul_through_it_matches_reference():
    x, qweight, scales, zeros = w4a16_inputs(7, 64, 256, 64, torch.float32, seed=3)
    out = w4a16_dequant_mm(x, qweight, scales, zeros, 64)
    ref = w4a16_reference(x, qweight, scales, zeros, None, None, 64)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
