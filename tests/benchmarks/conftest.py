"""Smoke runs of the issue-4 GPU benchmarks on CPU: each command runs end to end at a tiny
scale, in a subprocess, and writes its JSON result (and plot)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def ckpt_root(tmp_path_factory) -> Path:
    """One checkpoint folder for every benchmark smoke test (cpu-small is made once)."""
    return tmp_path_factory.mktemp("bench-ckpt")


def run_benchmark(module: str, out: Path, ckpt_root: Path, *args: str, shape: str = "cpu-small",
                  dtype: str = "float32") -> dict:
    """`python -m benchmarks.<module> --shape cpu-small --compile-mode none ...`; its JSON."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    json_path = out / f"{module}.json"
    cmd = [sys.executable, "-m", f"benchmarks.{module}", "--shape", shape,
           "--compile-mode", "none", "--dtype", dtype, "--checkpoint-dir", str(ckpt_root),
           "--json", str(json_path), *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ratio" in proc.stdout
    result = json.loads(json_path.read_text())
    assert result["device"] == "cpu" and result["args"]["shape"] == [shape]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "no plot" in proc.stdout
    else:
        assert json_path.with_suffix(".png").stat().st_size > 0
    return result
