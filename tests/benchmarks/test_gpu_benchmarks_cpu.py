"""Each issue-4 benchmark, run on CPU with tiny arguments: the table, JSON and plot it writes,
and that both sides (compiled-llm and its transformers peer) produced figures."""

from __future__ import annotations

import math

from tests.benchmarks.conftest import run_benchmark


def test_offline_throughput(tmp_path, ckpt_root):
    res = run_benchmark("offline_throughput", tmp_path, ckpt_root, "--num-requests", "6",
                        "--input-len", "8", "32", "--output-len", "4", "12")
    peer, *ours = res["rows"]
    assert peer["engine"].startswith("transformers") and peer["ratio"] == 1.0
    assert [r["engine"] for r in ours] == ["compiled-llm (none)", "compiled-llm (none, async)"]
    for r in ours:
        assert peer["finished"] == r["finished"] == "6/6"
        assert peer["output tokens"] == r["output tokens"] > 0  # the same exact workload
        assert r["ratio"] > 0 and r["raw"]["steps"] > 0 and r["raw"]["gpu_ms"] > 0


def test_decode_latency(tmp_path, ckpt_root):
    res = run_benchmark("decode_latency", tmp_path, ckpt_root, "--prompt-len", "16",
                        "--new-tokens", "8")
    assert res["copy_bw_gbs"] > 0
    peer, ours, ours_async = res["rows"]
    assert "static cache" in peer["engine"] and "async" in ours_async["engine"]
    for r in (peer, ours, ours_async):
        assert r["decode tok/s"] > 0 and 0 < r["% copy bw"] < 100
    for r, steps in ((ours, 8), (ours_async, 7)):  # one decode step launched per token;
        # async launched the window's first step before the window began
        assert r["weights GB"] * 1e9 == r["raw"]["weight_bytes"] > 0
        assert r["raw"]["rows"][0]["steps"] == steps


def test_batch_sweep(tmp_path, ckpt_root):
    res = run_benchmark("batch_sweep", tmp_path, ckpt_root, "--batch-sizes", "1", "3",
                        "--prompt-len", "16", "--new-tokens", "6", "--overhead-batch", "3",
                        "--peer-budget-s", "60")
    assert [r["batch"] for r in res["rows"]] == [1, 3]
    assert res["peer"] == {"cpu-small": {"skipped": [], "failed": {}}}
    for r in res["rows"]:
        for key in ("graphs on tok/s", "graphs off tok/s", "on + async tok/s",
                    "transformers tok/s"):
            assert r[key] > 0
        assert r["gpu ms (on)"] > 0 and math.isfinite(r["cpu % of gpu"])
        assert r["gpu ms (async)"] > 0 and math.isfinite(r["exposed host % (async)"])


def test_prefill(tmp_path, ckpt_root):
    res = run_benchmark("prefill", tmp_path, ckpt_root, "--lengths", "32", "96", "--reps", "1")
    assert res["gemm_peak_tflops"] > 0
    assert [r["tokens"] for r in res["rows"]] == [32, 96]
    for r in res["rows"]:
        assert r["ours tok/s"] > 0 and r["transformers tok/s"] > 0
        assert r["ours MFU %"] > 0 and r["transformers MFU %"] > 0
        assert r["model TFLOP"] > 0
