"""`small_m_gemm_tune --gate-up --quick` on the "tiny" shape under TRITON_INTERPRET=1 (in a
subprocess: the interpreter must be set before Triton is imported): its rows time the epilogue
and the unfused path, its table entries merge with the file's others and are what
tuning.gate_up_lookup reads back; a margin nothing meets writes "unfused"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import small_m_gemm_tune
from compiled_llm.gemm import tuning
from compiled_llm.gemm.tuning import SmallMConfig

ROOT = Path(__file__).resolve().parents[2]
GPU = "cpu-interpreter"  # the tuner's device name off the GPU
PLAIN = {"block_n": 32, "block_k": 64, "split_k": 1, "num_warps": 4, "num_stages": 3,
         "use_dot": False}


def _tune(out: Path, results: Path, margin: str, *tokens: str) -> dict:
    """One interpreted quick gate-up run on "tiny" into out; its --output-json."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "benchmarks.small_m_gemm_tune", "--gate-up", "--quick",
           "--shapes", "tiny", "--tokens", *tokens, "--margin", margin, "--out", str(out),
           "--output-json", str(results)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    assert "GATE_UP epilogue vs product + SiLU·mul" in proc.stdout
    return json.loads(results.read_text())


def test_gate_up_args_default_to_the_gate_up_shapes():
    args = small_m_gemm_tune.parse_args(["--gate-up"])
    assert args.shapes == ["qwen3-0.6b.gate_up", "llama3-8b.gate_up"]
    assert small_m_gemm_tune.parse_args([]).shapes == small_m_gemm_tune.DEFAULT_SHAPES
    with pytest.raises(SystemExit):
        small_m_gemm_tune.parse_args(["--gate-up", "--shapes", "qwen3-0.6b.o"])


def test_quick_gate_up_run_writes_entries_the_lookup_reads(tmp_path, monkeypatch):
    out = tmp_path / "small_m.json"
    kept = {"GPU X": {"4096,1024": {"1": "cublas"}}}
    # a split-K-free plain entry: the unfused path runs its kernel and "today" is timed too
    out.write_text(json.dumps({"devices": {**kept, GPU: {"96,320": {"16": PLAIN}}}}))
    # a margin every config meets (interpreted timings say nothing): the epilogue wins
    result = _tune(out, tmp_path / "first.json", "-1000", "1", "4")
    assert result["gate_up"] and [row["m"] for row in result["rows"]] == [1, 4]
    for row in result["rows"]:
        assert row["table key"] == "gate_up:96,320" and row["choice"] == "epilogue"
        assert row["plain"] == str(SmallMConfig(**PLAIN)) and row["candidates"] > 1
        assert row["unfused us"] > 0 and row["today us"] > 0
        assert row["unfused / epilogue"] == pytest.approx(row["unfused us"] / row["epilogue us"])
    payload = json.loads(out.read_text())["devices"]
    assert payload["GPU X"] == kept["GPU X"] and payload[GPU]["96,320"] == {"16": PLAIN}
    written = {int(m): SmallMConfig(**raw) for m, raw in payload[GPU]["gate_up:96,320"].items()}
    assert set(written) == {1, 4} and all(cfg.split_k == 1 for cfg in written.values())
    assert [str(written[row["m"]]) for row in result["rows"]] == [row["config"]
                                                                  for row in result["rows"]]

    monkeypatch.setenv(tuning.CONFIG_ENV, str(out))
    tuning.load_table.cache_clear()
    assert tuning.gate_up_lookup(GPU, 1, 96, 320) == written[1]
    assert tuning.gate_up_lookup(GPU, 3, 96, 320) == written[4]
    assert tuning.lookup(GPU, 1, 96, 320) == SmallMConfig(**PLAIN)  # the plain key untouched

    # a margin nothing meets: the M=4 entry becomes "unfused", the M=1 one stays
    result = _tune(out, tmp_path / "second.json", "1", "4")
    assert [row["choice"] for row in result["rows"]] == ["unfused"]
    tuning.load_table.cache_clear()
    assert json.loads(out.read_text())["devices"][GPU]["gate_up:96,320"]["4"] == "unfused"
    assert tuning.gate_up_lookup(GPU, 4, 96, 320) is None  # the unfused path...
    assert tuning.lookup(GPU, 4, 96, 320) == SmallMConfig(**PLAIN)  # ...though plain would fuse
    assert tuning.gate_up_lookup(GPU, 1, 96, 320) == written[1]
    tuning.load_table.cache_clear()
