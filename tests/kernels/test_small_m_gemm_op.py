"""The `compiled_llm::small_m_mm` op on the CPU (torch.mm, a fake impl for symbolic token
counts) and its tuned-table lookup: override file first, the smallest tuned M at or above the
token count, cuBLAS past the table, for "cublas" entries and off the GPU; the gated op
`small_m_mm_silu_mul` on the CPU: eager silu(gate) * up, then torch.mm."""

from __future__ import annotations

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


def test_shipped_table_parses():
    assert isinstance(tuning.load_table(str(tuning.SHIPPED)), dict)
