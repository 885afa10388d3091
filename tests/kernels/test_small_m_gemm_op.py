"""The `compiled_llm::small_m_mm` op on the CPU (torch.mm, a fake impl for symbolic token
counts) and its tuned-table lookup: override file first, the smallest tuned M at or above the
token count, cuBLAS past the table, for "cublas" entries and off the GPU; the GATE_UP epilogue's
lookup ("gate_up:N,K" entries first, "unfused" markers, else the plain config without split-K);
the gated op `small_m_mm_silu_mul` on the CPU: eager silu(gate) * up, then torch.mm."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

from compiled_llm.gemm import SmallMConfig, small_m_mm, small_m_mm_silu_mul, tuning


def test_cpu_op_is_mm_and_fake_keeps_symbolic_rows():
    x, weight = torch.randn(3, 8), torch.randn(5, 8)
    torch.testing.assert_close(small_m_mm(x, weight), torch.mm(x, weight.t()))
    torch.library.opcheck(torch.ops.compiled_llm.small_m_mm.default, (x, weight))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_gated_op_is_silu_mul_then_mm(dtype):
    gate_up, weight = torch.randn(3, 16).to(dtype), torch.randn(5, 8).to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)  # strided views of one [M, 2K] tensor
    ref = torch.mm(F.silu(gate) * up, weight.t())
    assert torch.equal(small_m_mm_silu_mul(gate, up, weight), ref)
    torch.library.opcheck(torch.ops.compiled_llm.small_m_mm_silu_mul.default,
                          (gate, up, weight))


@pytest.fixture
def table(tmp_path, monkeypatch):
    cfg = {"block_n": 32, "block_k": 256, "split_k": 4, "num_warps": 4, "num_stages": 3,
           "use_dot": False}
    payload = {"devices": {"GPU X": {"4096,1024": {"1": cfg, "4": "cublas",
                                                   "16": {**cfg, "use_dot": True}}}}}
    path = tmp_path / "small_m.json"
    path.write_text(json.dumps(payload))
    monkeypatch.setenv(tuning.CONFIG_ENV, str(path))
    return SmallMConfig(**cfg)


def test_lookup_takes_the_smallest_tuned_m_at_or_above(table):
    assert tuning.lookup("GPU X", 1, 4096, 1024) == table
    assert tuning.lookup("GPU X", 2, 4096, 1024) is None  # the M=4 entry says cuBLAS
    assert tuning.lookup("GPU X", 8, 4096, 1024).use_dot
    assert tuning.lookup("GPU X", 17, 4096, 1024) is None  # past MAX_M
    assert tuning.lookup("GPU X", 1, 1024, 4096) is None  # no entry
    assert tuning.lookup("GPU Y", 1, 4096, 1024) is None


def test_cpu_and_float32_always_take_cublas(table):
    x, weight = torch.randn(1, 1024), torch.randn(4096, 1024)
    assert tuning.tuned_config(x, weight) is None
    assert tuning.tuned_config(x.bfloat16(), weight.bfloat16()) is None


def test_triton_tuned_only_for_shapes_with_a_triton_entry(table, monkeypatch):
    monkeypatch.setattr(tuning, "device_name", lambda index: "GPU X")
    cuda = torch.device("cuda", 0)
    assert tuning.triton_tuned(cuda, torch.bfloat16, 4096, 1024)
    assert not tuning.triton_tuned(cuda, torch.float32, 4096, 1024)
    assert not tuning.triton_tuned(cuda, torch.bfloat16, 1024, 4096)
    assert not tuning.triton_tuned(torch.device("cpu"), torch.bfloat16, 4096, 1024)


@pytest.fixture
def gate_up_table(tmp_path, monkeypatch):
    """Plain entries without split-K for three gate/up weights; a "gate_up:" key for two."""
    plain = SmallMConfig(64, 256, num_stages=4, use_dot=True)
    tuned = SmallMConfig(16, 512, num_warps=8, num_stages=2, use_dot=True)
    raw, raw_plain = dataclasses.asdict(tuned), dataclasses.asdict(plain)
    split = {**raw_plain, "split_k": 2}
    shapes = {"6144,1024": {"16": raw_plain}, "gate_up:6144,1024": {"2": raw, "8": "unfused"},
              "2048,512": {"16": raw_plain}, "gate_up:2048,512": {"16": "unfused"},
              "28672,4096": {"1": raw_plain, "4": split}}
    path = tmp_path / "small_m.json"
    path.write_text(json.dumps({"devices": {"GPU X": shapes}}))
    monkeypatch.setenv(tuning.CONFIG_ENV, str(path))
    monkeypatch.setattr(tuning, "device_name", lambda index: "GPU X")
    return plain, tuned


def test_gate_up_entry_wins_and_unfused_marker_takes_the_unfused_path(gate_up_table):
    plain, tuned = gate_up_table
    assert tuning.lookup("GPU X", 1, 6144, 1024) == plain  # the plain product keeps its own
    assert tuning.gate_up_lookup("GPU X", 1, 6144, 1024) == tuned
    assert tuning.gate_up_lookup("GPU X", 2, 6144, 1024) == tuned
    assert tuning.gate_up_lookup("GPU X", 4, 6144, 1024) is None  # "unfused", plain has no split
    assert tuning.gate_up_lookup("GPU X", 16, 6144, 1024) is None  # past the tuned Ms: unfused
    assert tuning.gate_up_lookup("GPU X", 17, 6144, 1024) is None
    assert tuning.tuned_entry("GPU X", 4, 6144, 1024, tuning.GATE_UP) == tuning.UNFUSED
    assert tuning.tuned_entry("GPU X", 1, 28672, 4096, tuning.GATE_UP) is None  # no such key


def test_without_a_gate_up_entry_the_plain_config_without_split_k(gate_up_table):
    plain, _ = gate_up_table
    halved = tuning.gate_up_lookup("GPU X", 1, 28672, 4096)
    assert halved == SmallMConfig(32, 256, num_stages=4, use_dot=True)  # the plain grid
    assert tuning.gate_up_lookup("GPU X", 2, 28672, 4096) is None  # split-K: unfused
    assert tuning.gate_up_lookup("GPU X", 8, 28672, 4096) is None  # past the table: cuBLAS
    assert tuning.gate_up_from_plain(SmallMConfig(16, 64, use_dot=True)).block_n == 16
    assert tuning.gate_up_from_plain(SmallMConfig(8, 64)).block_n == 4
    assert tuning.gate_up_from_plain(None) is None


def test_gate_up_fusion_follows_the_gate_up_entries(gate_up_table):
    cuda = torch.device("cuda", 0)
    assert tuning.gate_up_fused(cuda, torch.bfloat16, 6144, 1024)
    assert not tuning.gate_up_fused(cuda, torch.bfloat16, 2048, 512)  # "unfused" at every M
    assert tuning.triton_tuned(cuda, torch.bfloat16, 2048, 512)  # though its plain GEMM fuses
    assert tuning.gate_up_fused(cuda, torch.bfloat16, 28672, 4096)  # the plain M=1 config
    assert not tuning.gate_up_fused(cuda, torch.float32, 6144, 1024)
    x, weight = torch.randn(1, 1024), torch.randn(6144, 1024)
    assert tuning.gate_up_config(x.bfloat16(), weight.bfloat16()) is None  # CPU tensors


def test_shipped_table_parses():
    assert isinstance(tuning.load_table(str(tuning.SHIPPED)), dict)
