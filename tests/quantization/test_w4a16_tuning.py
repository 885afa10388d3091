"""The W4A16 tuned-tile file: read per GPU and weight shape, the nearest tuned token count
chosen, the override file ahead of the shipped one, and no entry meaning the built-in tiles."""

from __future__ import annotations

import json

from compiled_llm.quantization.kernels import w4a16_tuning
from compiled_llm.quantization.kernels.w4a16 import W4A16Config, w4a16_config


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
    for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)):
        cfg = w4a16_config(1, n, k, 128)
        assert cfg.block_m == 16 and cfg.block_k == 128 and k % (cfg.block_k * cfg.split_k) == 0
        assert -(-n // cfg.block_n) * cfg.split_k >= 264 or cfg.split_k == 8
    assert w4a16_config(4096, 4096, 4096, 128).split_k == 1  # prefill: no partial sums
