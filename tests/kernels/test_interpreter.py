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
(TRITON_INTERPRET=1) in one subprocess, each file judged from its JUnit report.

TRITON_INTERPRET must be set before Triton is first imported and would turn every later
@triton.jit in the process into interpreted code; a subprocess keeps it away from the other tests
(Inductor, GPU kernels) that run in the same pytest process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
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


@pytest.fixture(scope="module")
def interpreted_report(tmp_path_factory) -> tuple[dict[str, list[ET.Element]], str]:
    """Every case file in one interpreted pytest run (one torch and Triton import, not 14):
    its test cases grouped by file, and the run's output tail."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    report = tmp_path_factory.mktemp("interpreted") / "report.xml"
    paths = [str(Path(__file__).with_name(cases)) for cases in CASES]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
         f"--junitxml={report}", *paths],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
    )
    out = (proc.stdout + proc.stderr)[-20000:]
    assert report.exists(), out
    by_file: dict[str, list[ET.Element]] = {}
    for case in ET.parse(report).iter("testcase"):
        by_file.setdefault(case.get("classname", "").rsplit(".", 1)[-1] + ".py", []).append(case)
    return by_file, out


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="CPU check; on a GPU the kernels are tested natively (test_triton_gpu)")
@pytest.mark.parametrize("cases", CASES)
def test_kernels_match_reference_under_interpreter(cases, interpreted_report):
    by_file, out = interpreted_report
    ran = by_file.get(cases, [])
    assert ran, f"no test of {cases} ran\n{out}"
    bad = [case for case in ran if len(case)]  # failure, error or skipped children
    assert not bad, "\n\n".join(
        f"{case.get('name')}: {child.tag}\n{child.text or child.get('message')}"
        for case in bad for child in case)


def test_cpu_tensors_without_interpreter_raise():
    if kernels_interpreted():
        pytest.skip("this process interprets Triton kernels")
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        check_shapes(torch.zeros(2, 4, 16), torch.zeros(2, 3, 16, 2, 16))
    with pytest.raises(ValueError, match="head_dim"):
        check_shapes(torch.zeros(2, 4, 24), torch.zeros(2, 3, 16, 2, 24))
