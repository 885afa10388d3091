"""The lifecycle benchmark, run on CPU at a tiny scale: every phase is in its JSON, memory is
back after each shutdown or drop, dropped engines are freed, and every LLM gives the first
one's greedy tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_lifecycle_benchmark(tmp_path, ckpt_root):
    json_path = tmp_path / "lifecycle.json"
    cmd = [sys.executable, "-m", "benchmarks.lifecycle", "--shape", "cpu-small",
           "--compile-mode", "none", "--dtype", "float32", "--checkpoint-dir", str(ckpt_root),
           "--num-prompts", "2", "--prompt-len", "8", "--new-tokens", "4",
           "--json", str(json_path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(json_path.read_text())
    assert result["device"] == "cpu" and result["failures"] == []
    phases = [r["phase"] for r in result["rows"]]
    assert phases[:5] == ["start", "built", "generated", "shut down", "deleted"]
    assert {"second generated", "two generated", "two shut down"} <= set(phases)
    checked = [r for r in result["rows"] if r["back"]]
    assert len(checked) == 5 and all(r["back"] == "yes" for r in checked)
    assert [r["tokens"] for r in result["rows"] if r["tokens"]] == ["match", "match"]
    assert [r["engine freed"] for r in result["rows"] if r["engine freed"]] == ["yes", "yes"]
    assert all(r["allocated GB"] > 0 for r in result["rows"])
