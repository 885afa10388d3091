"""Runs small_m_gemm_interpreted_cases.py (the small-M GEMM kernel) under Triton's interpreter
(TRITON_INTERPRET=1) in a subprocess, as test_interpreter.py does for the other kernels: the
variable must be set before Triton is first imported, away from this process's other tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="CPU check; on a GPU the kernel is tested natively")
def test_small_m_gemm_matches_mm_under_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    path = Path(__file__).with_name("small_m_gemm_interpreted_cases.py")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-20000:]
    assert " passed" in out and "skipped" not in out, out[-5000:]
