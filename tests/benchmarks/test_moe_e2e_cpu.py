"""benchmarks/moe_e2e.py on CPU at the tiny cpu-moe shape: the bf16 checkpoint converted to
block FP8 shard by shard, compiled-llm's decode and workload phases and transformers' decode on
the same FP8 checkpoint, the JSON written with every phase's row."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.benchmarks.conftest import ROOT


@pytest.mark.slow  # four processes (the script and three engines)
def test_fp8_phases_write_their_rows(tmp_path, ckpt_root):
    out = tmp_path / "moe_e2e.json"
    cmd = [sys.executable, "-m", "benchmarks.moe_e2e", "--shape", "cpu-moe", "--formats",
           "fp8-block", "--compile-mode", "none", "--dtype", "float32", "--checkpoint-dir",
           str(ckpt_root), "--batch-sizes", "2", "--new-tokens", "4", "--peer-new-tokens", "6",
           "--num-requests", "2", "--input-len", "8", "12", "--output-len", "3", "5",
           "--peer-max-seconds", "0", "--output-json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    phases = [(r["engine"], r["phase"]) for r in rows]
    assert phases == [("compiled-llm", "decode b2"), ("transformers (eager)", "decode b2"),
                      ("compiled-llm", "nano-vllm")]
    assert all(r["format"] == "fp8-block" and r["tok/s"] > 0 for r in rows), rows
    assert rows[-1]["finished"] == "2/2"
    config = json.loads((ckpt_root / "cpu-moe-fp8-block" / "config.json").read_text())
    assert config["quantization_config"]["weight_block_size"] == [128, 128]
