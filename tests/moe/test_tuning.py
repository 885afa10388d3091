"""The fused MoE kernel's tuned-config files: written and read back, the nearest token count
chosen, the override directory searched first, and no tuned config on the CPU."""

from __future__ import annotations

import torch

from compiled_llm.moe import tuning
from compiled_llm.moe.kernels import MoeGemmConfig


def test_tuned_file_round_trip_and_nearest(tmp_path, monkeypatch):
    small, large = MoeGemmConfig(block_m=16, block_n=32), MoeGemmConfig(block_m=128, num_warps=8)
    name = tuning.config_file_name(8, 64, 32, torch.bfloat16, "NVIDIA H200")
    assert name == "E=8,N=64,K=32,device=NVIDIA_H200,dtype=bf16.json"
    tuning.save_tuned(tmp_path / name, {1: small, 1024: large}, {"iters": 1})
    monkeypatch.setenv(tuning.CONFIG_DIR_ENV, str(tmp_path))
    tuning.load_tuned.cache_clear()
    table = tuning.load_tuned(name)
    assert table == {1: small, 1024: large}
    assert tuning.nearest(table, 200) is table[1] and tuning.nearest(table, 600) is table[1024]
    assert tuning.search_dirs()[0] == tmp_path
    assert tuning.load_tuned("E=1,N=2,K=3,device=x,dtype=bf16.json") is None


def test_no_tuned_config_on_cpu():
    assert tuning.tuned_config(4, torch.zeros(8, 64, 32, dtype=torch.bfloat16)) is None
