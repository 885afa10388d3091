"""The W4A16 tuned-tile file: read per GPU and weight shape, the nearest tuned token count
chosen, the override file ahead of the shipped one, and no entry meaning the built-in tiles; the
small-M choice (GEMV or tinygemm) from the file's small_m entries and its env override."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from compiled_llm.quantization.kernels import w4a16_tuning
from compiled_llm.quantization.kernels.w4a16 import (
    W4A16Config,
    gemv_fits,
    w4a16_config,
    w4a16_gemv_config,
)

LLAMA_SHAPES = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))


def test_lookup_reads_the_override_file(tmp_path, monkeypatch):
    cfg = {"block_m": 16, "block_n": 64, "block_k": 128, "split_k": 4, "expand": True}
    table = {"devices": {"GPU X": {"6144x4096": {"1": cfg, "16": {**cfg, "split_k": 2},
                                                "64": {**cfg, "block_m": 64, "split_k": 1}}}}}
    path = tmp_path / "w4a16.json"
    path.write_text(json.dumps(table))
    monkeypatch.setenv(w4a16_tuning.CONFIG_ENV, str(path))
    assert w4a16_tuning.lookup("GPU X", 1, 6144, 4096) == W4A16Config(**cfg)
    assert w4a16_tuning.lookup("GPU X", 20, 6144, 4096).split_k == 2  # 16 is nearest
    assert w4a16_tuning.lookup("GPU X", 40, 6144, 4096).split_k == 2  # a tie: the smaller
    assert w4a16_tuning.lookup("GPU X", 300, 6144, 4096).block_m == 64
    assert w4a16_tuning.lookup("GPU X", 1, 4096, 4096) is None  # another shape
    assert w4a16_tuning.lookup("GPU Y", 1, 6144, 4096) is None  # another GPU


def test_built_in_tiles_cover_the_gpu_at_decode():
    for n, k in LLAMA_SHAPES:
        cfg = w4a16_config(1, n, k, 128)
        assert cfg.block_m == 16 and cfg.block_k == 128 and k % (cfg.block_k * cfg.split_k) == 0
        assert -(-n // cfg.block_n) * cfg.split_k >= 264 or cfg.split_k == 8
    assert w4a16_config(4096, 4096, 4096, 128).split_k == 1  # prefill: no partial sums


@pytest.fixture
def small_m_file(tmp_path, monkeypatch):
    """A tuned file for "GPU X": the GEMV beat tinygemm at 1 token on 6144x4096, not at 4."""
    table = {"devices": {}, "tinygemm_max_rows": {"GPU X": 4},
             "small_m": {"GPU X": {"6144x4096": {"1": "gemv", "4": "tinygemm"},
                                   "28672x4096": {"1": "mma"}}}}
    path = tmp_path / "w4a16.json"
    path.write_text(json.dumps(table))
    monkeypatch.setenv(w4a16_tuning.CONFIG_ENV, str(path))
    for name in (w4a16_tuning.SMALL_M_ENV, w4a16_tuning.TINYGEMM_ENV, w4a16_tuning.DEQUANT_ENV):
        monkeypatch.delenv(name, raising=False)


def test_tuned_small_m_choice_picks_the_gemv(small_m_file):
    path = w4a16_tuning.w4a16_path
    assert path("GPU X", 1, 6144, 4096, tinygemm_ok=True) == "gemv"
    assert path("GPU X", 2, 6144, 4096, tinygemm_ok=True) == "gemv"  # 1 is nearest
    assert path("GPU X", 3, 6144, 4096, tinygemm_ok=True) == "tinygemm"  # 4 is nearest
    assert path("GPU X", 3, 6144, 4096, tinygemm_ok=False) == "triton"  # no tinygemm tensors
    assert path("GPU X", 1, 4096, 4096, tinygemm_ok=True) == "tinygemm"  # no entry: as before
    assert path("GPU Y", 1, 6144, 4096, tinygemm_ok=True) == "tinygemm"
    assert path("GPU X", 16, 6144, 4096, tinygemm_ok=True) == "triton"  # past both thresholds
    assert path("GPU X", 256, 6144, 4096, tinygemm_ok=True) == "dequant"
    assert path("GPU X", 4, 28672, 4096, tinygemm_ok=True) == "mma"  # the MMA tiles won


def test_small_m_override_wins_both_ways(small_m_file, monkeypatch):
    path = w4a16_tuning.w4a16_path
    monkeypatch.setenv(w4a16_tuning.SMALL_M_ENV, "tinygemm")
    assert path("GPU X", 1, 6144, 4096, tinygemm_ok=True) == "tinygemm"
    monkeypatch.setenv(w4a16_tuning.SMALL_M_ENV, "gemv")
    assert path("GPU X", 4, 4096, 4096, tinygemm_ok=True) == "gemv"  # any shape, up to 4 rows
    assert path("GPU Y", 1, 6144, 4096, tinygemm_ok=False) == "gemv"
    assert path("GPU X", 5, 4096, 4096, tinygemm_ok=False) == "triton"
    monkeypatch.setenv(w4a16_tuning.SMALL_M_ENV, "mma")
    assert path("GPU X", 1, 6144, 4096, tinygemm_ok=True) == "mma"  # over the file's gemv
    monkeypatch.setenv(w4a16_tuning.SMALL_M_ENV, "fastest")
    with pytest.raises(ValueError, match=w4a16_tuning.SMALL_M_ENV):
        path("GPU X", 1, 6144, 4096, tinygemm_ok=True)


def test_tinygemm_env_wins_over_the_files_small_m(small_m_file, monkeypatch):
    """A small_m "tinygemm" entry sends its point to tinygemm past the files' row limit, but
    $COMPILED_LLM_W4A16_TINYGEMM_MAX_ROWS, when set, decides alone (0: never tinygemm)."""
    path = w4a16_tuning.w4a16_path
    table = json.loads(Path(os.environ[w4a16_tuning.CONFIG_ENV]).read_text())
    table["tinygemm_max_rows"]["GPU X"] = 1
    Path(os.environ[w4a16_tuning.CONFIG_ENV]).write_text(json.dumps(table))
    w4a16_tuning._tinygemm_rows_table.cache_clear()
    w4a16_tuning._small_m_table.cache_clear()
    assert path("GPU X", 4, 6144, 4096, tinygemm_ok=True) == "tinygemm"  # the entry says so
    assert path("GPU X", 4, 4096, 4096, tinygemm_ok=True) == "triton"  # no entry, past 1 row
    monkeypatch.setenv(w4a16_tuning.TINYGEMM_ENV, "0")
    assert path("GPU X", 4, 6144, 4096, tinygemm_ok=True) == "triton"
    assert path("GPU X", 1, 4096, 4096, tinygemm_ok=True) == "triton"


def test_shipped_file_keeps_tinygemm_until_retuned(monkeypatch):
    monkeypatch.delenv(w4a16_tuning.CONFIG_ENV, raising=False)
    monkeypatch.delenv(w4a16_tuning.SMALL_M_ENV, raising=False)
    monkeypatch.delenv(w4a16_tuning.TINYGEMM_ENV, raising=False)
    for n, k in LLAMA_SHAPES:
        for m in (1, 4):
            choice = w4a16_tuning.small_m_choice("NVIDIA H200", m, n, k)
            # re-tuned files may say gemv or mma
            expected = choice if choice in ("gemv", "mma") else "tinygemm"
            assert w4a16_tuning.w4a16_path("NVIDIA H200", m, n, k, True) == expected


def test_built_in_gemv_tiles_fit_and_cover_the_gpu():
    for n, k in LLAMA_SHAPES:
        for m in range(1, w4a16_tuning.GEMV_MAX_ROWS + 1):
            cfg = w4a16_gemv_config(m, n, k, 128)
            assert cfg.gemv and gemv_fits(cfg, m, k, 128) and cfg.split_k == 1  # 8B: no split
            assert -(-n // cfg.block_n) >= 132 and cfg.block_n * cfg.block_k // 8 // 128 >= 4
    small = w4a16_gemv_config(1, 1024, 4096, 128)  # a small model's: K split to fill the GPU
    assert -(-1024 // small.block_n) * small.split_k >= 132
    assert w4a16_gemv_config(1, 64, 4096, 48) is None  # a group that is no power of two


def test_gemv_fits_only_nested_power_of_two_tiles():
    cfg = W4A16Config(1, 32, 256, 1, gemv=True)
    assert gemv_fits(cfg, 4, 4096, 32) and gemv_fits(cfg, 1, 4096, 512)
    assert not gemv_fits(cfg, 5, 4096, 128)  # more rows than the GEMV takes
    assert not gemv_fits(cfg, 1, 4224, 128)  # K not a multiple of block_k
    assert not gemv_fits(W4A16Config(1, 32, 256, 1), 1, 4096, 128)  # an MMA config
    assert not gemv_fits(W4A16Config(1, 24, 256, 1, gemv=True), 1, 4096, 128)
    assert not gemv_fits(W4A16Config(1, 32, 192, 1, gemv=True), 1, 3072, 64)


def test_device_name_is_torchs(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: f"GPU {index}")
    assert w4a16_tuning.device_name.__wrapped__(3) == "GPU 3"
