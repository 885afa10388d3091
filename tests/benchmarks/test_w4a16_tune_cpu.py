"""The W4A16 tuner and small-M A/B benchmark without a GPU: they import, parse their arguments,
the GEMV candidates fit the kernel, and the file the tuner writes is the one the op's selection
reads (a GEMV win at one token becomes its small_m entry and tuned tiles)."""

from __future__ import annotations

import argparse
import os

from benchmarks import w4a16_small_m, w4a16_tune
from compiled_llm.quantization.kernels import w4a16_tuning
from compiled_llm.quantization.kernels.w4a16 import W4A16Config, gemv_fits


def test_arguments_parse():
    args = w4a16_tune.parse_args(["--gemv-only", "--tokens", "1", "4", "--shapes", "o",
                                  "--gemv-warps", "4", "--gemv-stages", "1", "2"])
    assert args.gemv_only and args.tokens == [1, 4] and args.gemv_stages == [1, 2]
    ab = w4a16_small_m.parse_args(["--variants", "bf16", "gemv", "tinygemm"])
    assert ab.variants == ["bf16", "gemv", "tinygemm"] and ab.batch_sizes == [1, 2, 4]


def test_gemv_candidates_fit_and_load_16_bytes():
    args = w4a16_tune.parse_args([])
    for n, k in w4a16_tune.SHAPES.values():
        found = w4a16_tune.gemv_candidates(1, n, k, args)
        assert found and all(gemv_fits(cfg, 1, k, w4a16_tune.GROUP) for cfg in found)
        assert all(cfg.block_n * cfg.block_k // 8 >= 4 * 32 * cfg.num_warps for cfg in found)
    assert not w4a16_tune.gemv_candidates(16, 4096, 4096, args)
    args.gpu = "GPU X"
    tried = w4a16_tune.candidates(1, 4096, 4096, args)
    assert any(cfg.gemv for cfg in tried) and sum(not cfg.gemv for cfg in tried) > 1
    args.gemv_only = True  # the built-in MMA tiles only, beside the GEMV's
    assert sum(not cfg.gemv for cfg in w4a16_tune.candidates(1, 4096, 4096, args)) == 1
    args.quick = True
    assert len(w4a16_tune.candidates(1, 4096, 4096, args)) == 2


def _row(m: int, winner: str, gemv: W4A16Config, mma: W4A16Config) -> dict:
    ms = {"gemv": 0.004, "tinygemm": 0.005, "mma": 0.006}
    ms[winner] = 0.003
    return {"shape": "o", "m": m, "winner": winner, "best": gemv if winner == "gemv" else mma,
            "gemv": gemv, "gemv ms": ms["gemv"], "tinygemm ms": ms["tinygemm"],
            "mma ms": ms["mma"], "bf16 ms": 0.01, "weight bytes": 4096 * 4096 // 2}


def test_written_file_is_what_the_selection_reads(tmp_path, monkeypatch):
    gemv = W4A16Config(1, 32, 256, 1, gemv=True)
    mma = W4A16Config(16, 64, 128, 4)
    rows = [_row(1, "gemv", gemv, mma), _row(2, "mma", gemv, mma), _row(4, "tinygemm", gemv, mma),
            _row(16, "mma", gemv, mma)]
    table = {"4096x4096": {str(row["m"]): row for row in rows}}
    args = argparse.Namespace(out=str(tmp_path / "w4a16.json"), gpu="GPU X", output_json=None)
    w4a16_tune.write(args, table, rows, 1.0)
    monkeypatch.setenv(w4a16_tuning.CONFIG_ENV, args.out)
    monkeypatch.delenv(w4a16_tuning.SMALL_M_ENV, raising=False)
    monkeypatch.delenv(w4a16_tuning.TINYGEMM_ENV, raising=False)
    assert w4a16_tuning.lookup("GPU X", 1, 4096, 4096) == gemv
    assert w4a16_tuning.w4a16_path("GPU X", 1, 4096, 4096, tinygemm_ok=True) == "gemv"
    assert w4a16_tuning.w4a16_path("GPU X", 4, 4096, 4096, tinygemm_ok=True) == "tinygemm"
    assert w4a16_tuning.lookup("GPU X", 2, 4096, 4096) == mma
    assert w4a16_tuning.w4a16_path("GPU X", 2, 4096, 4096, tinygemm_ok=True) == "mma"
    assert w4a16_tuning.small_m_choice("GPU X", 16, 4096, 4096) is None
    assert w4a16_tune.tinygemm_rows(rows) == 1  # the MMA tiles beat it at 2 tokens
    printed = w4a16_tune.table_row(rows[0])
    assert printed["winner"] == "gemv" and printed["gemv GB/s"] > printed["tinygemm GB/s"]


def test_small_m_env_is_set_for_the_block_only(monkeypatch):
    monkeypatch.setenv(w4a16_tuning.SMALL_M_ENV, "tinygemm")
    with w4a16_small_m.small_m_env("gemv"):
        assert os.environ[w4a16_tuning.SMALL_M_ENV] == "gemv"
    with w4a16_small_m.small_m_env(None):
        assert w4a16_tuning.SMALL_M_ENV not in os.environ
    assert os.environ[w4a16_tuning.SMALL_M_ENV] == "tinygemm"
    rows = [{"format": "bf16", "batch": 1, "tok_s": 100.0},
            {"format": "w4a16 gemv", "batch": 1, "tok_s": 250.0}]
    w4a16_small_m.add_ratios(rows)
    assert rows[1]["x bf16"] == 2.5
