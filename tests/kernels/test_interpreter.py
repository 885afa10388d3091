"""Runs interpreted_cases.py (attention), moe_interpreted_cases.py (fused MoE),
moe_bias_interpreted_cases.py (its biases, swigluoai and gelu_tanh),
fp8_kv_interpreted_cases.py (FP8 KV cache), lora_interpreted_cases.py (LoRA shrink/expand),
quant_interpreted_cases.py (W4A16 and block-FP8 GEMMs), w4a16_dequant_interpreted_cases.py,
qk_norm_rope_interpreted_cases.py (the fused QK-norm + RoPE + KV write),
decode_qk_interpreted_cases.py (that write inside split decode attention),
gumbel_interpreted_cases.py (the one-pass temperature sampler),
fused_topk_interpreted_cases.py (the sort-free top-k/top-p/min-p sampler),
small_m_gemm_interpreted_cases.py (the small-M GEMM) and small_m_epilogue_interpreted_cases.py
(its split-K sum + residual add + RMSNorm) under Triton's interpreter
(TRITON_INTERPRET=1) in a subprocess.

TRITON_INTERPRET must be set before Triton is first imported and would turn every later
@triton.jit in the process into interpreted code; a subprocess keeps it away from the other tests
(Inductor, GPU kernels) that run in the same pytest process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from compiled_llm.attention.kernels import kernels_interpreted
from compiled_llm.attention.triton_backend import check_shapes

ROOT = Path(__file__).resolve().parents[2]
CASES = ("interpreted_cases.py", "moe_interpreted_cases.py", "moe_bias_interpreted_cases.py",
         "fp8_kv_interpreted_cases.py",
         "lora_interpreted_cases.py", "quant_interpreted_cases.py",
         "w4a16_dequant_interpreted_cases.py", "qk_norm_rope_interpreted_cases.py",
         "decode_qk_interpreted_cases.py", "gumbel_interpreted_cases.py",
         "fused_topk_interpreted_cases.py",
         "small_m_gemm_interpreted_cases.py", "small_m_epilogue_interpreted_cases.py",
         "small_m_norm_interpreted_cases.py")


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="CPU check; on a GPU the kernels are tested natively (test_triton_gpu)")
@pytest.mark.parametrize("cases", CASES)
def test_kernels_match_reference_under_interpreter(cases):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    path = Path(__file__).with_name(cases)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-20000:]
    assert " passed" in out and "skipped" not in out, out[-5000:]


def test_cpu_tensors_without_interpreter_raise():
    if kernels_interpreted():
        pytest.skip("this process interprets Triton kernels")
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        check_shapes(torch.zeros(2, 4, 16), torch.zeros(2, 3, 16, 2, 16))
    with pytest.raises(ValueError, match="head_dim"):
        check_shapes(torch.zeros(2, 4, 24), torch.zeros(2, 3, 16, 2, 24))
