"""The W4A16 and block-FP8 Triton GEMMs (and their split-K GEMV paths) against the torch
references, run by test_interpreter.py in a subprocess with TRITON_INTERPRET=1 (CPU tensors,
small shapes)."""

from __future__ import annotations

import json

import pytest
import torch

from compiled_llm.attention.kernels import kernels_interpreted
from compiled_llm.quantization.fp8_groups import quant_fp8_groups
from compiled_llm.quantization.kernels import w4a16 as w4a16_kernels_module
from compiled_llm.quantization.kernels import w4a16_tuning
from compiled_llm.quantization.kernels.fp8_block import (
    fp8_block_gemm_triton,
    quant_fp8_groups_triton,
)
from compiled_llm.quantization.kernels.w4a16 import W4A16Config, w4a16_gemm_triton
from compiled_llm.quantization.packing import pack_int4
from compiled_llm.quantization.w4a16 import w4a16_kernels, w4a16_reference
from compiled_llm.quantization.w8a8 import fp8_block_reference

pytestmark = pytest.mark.skipif(not kernels_interpreted(), reason="needs TRITON_INTERPRET=1")
TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 8e-3}


def w4a16_inputs(m: int, n: int, k: int, group: int, dtype: torch.dtype, seed: int = 0):
    """x [m, k], packed weight [n, k / 8], scales and zeros [n, k / group]."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(dtype)
    values = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(n, k // group, generator=gen) * 0.02 + 0.005).to(dtype)
    zeros = torch.randint(0, 16, (n, k // group), generator=gen, dtype=torch.uint8)
    return x, pack_int4(values), scales, zeros


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("m", "n", "k", "group"), [(1, 48, 256, 128), (5, 64, 128, 32),
                                                    (33, 40, 256, 64)])
def test_matches_reference(m, n, k, group, dtype):
    x, qweight, scales, zeros = w4a16_inputs(m, n, k, group, dtype, seed=m + n)
    out = w4a16_gemm_triton(x, qweight, scales, zeros, group)
    ref = w4a16_reference(x, qweight, scales, zeros, None, None, group)
    assert out.dtype == dtype and out.shape == (m, n)
    scale = max(1.0, ref.float().abs().max().item())
    assert (out.float() - ref.float()).abs().max().item() <= TOLERANCE[dtype] * scale


def test_split_k_partials_add_up():
    x, qweight, scales, zeros = w4a16_inputs(3, 32, 256, 32, torch.float32, seed=7)
    ref = w4a16_reference(x, qweight, scales, zeros, None, None, 32)
    for split, expand in ((1, False), (3, True), (8, False)):  # 3: the last split is short
        config = W4A16Config(16, 16, 32, split, num_stages=1, expand=expand)
        torch.testing.assert_close(w4a16_gemm_triton(x, qweight, scales, zeros, 32, config),
                                   ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiles_tuned_for_a_larger_group_fall_back_to_fitting_ones(dtype):
    """Tiles are tuned per shape (for group 128); a checkpoint with groups of 32 given a 128-wide
    K tile must not read one group's scale and zero for four: the built-in tiles run instead."""
    x, qweight, scales, zeros = w4a16_inputs(5, 32, 256, 32, dtype, seed=1)
    ref = w4a16_reference(x.float(), qweight, scales.float(), zeros, None, None, 32)
    out = w4a16_gemm_triton(x, qweight, scales, zeros, 32, W4A16Config(16, 16, 128, 1))
    tolerance = TOLERANCE[dtype] * max(1.0, ref.abs().max().item())
    assert (out.float() - ref).abs().max().item() <= tolerance


def test_unpaired_knob_runs_the_integer_path(monkeypatch):
    """$COMPILED_LLM_W4A16_PAIRED=0 (the A/B knob) runs 16-bit x through the integer unpacking,
    which agrees with the reference as well."""
    x, qweight, scales, zeros = w4a16_inputs(3, 32, 256, 64, torch.float16, seed=3)
    assert w4a16_tuning.paired_dequant(x) and not w4a16_tuning.paired_dequant(x.float())
    monkeypatch.setenv(w4a16_tuning.PAIRED_ENV, "0")
    assert not w4a16_tuning.paired_dequant(x)
    out = w4a16_gemm_triton(x, qweight, scales, zeros, 64)
    ref = w4a16_reference(x, qweight, scales, zeros, None, None, 64)
    assert (out.float() - ref.float()).abs().max().item() <= 5e-3 * max(1.0, ref.abs().max())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_paired_mma_is_exact_at_every_nibble_and_zero(dtype):
    """The 16-bit path's q - z is exact for every (q, z) pair in every row: with x one-hot per
    column and scale 1 the product is the integer q - z itself, split K or not."""
    n, k, group = 40, 256, 16  # 40 rows: the last row tile is partly masked
    rows, cols = torch.arange(n)[:, None], torch.arange(k)[None, :]
    values = ((rows + cols) % 16).to(torch.uint8)  # rows differ: a wrong row stride shows
    zeros = ((5 * rows + torch.arange(k // group)[None, :]) % 16).to(torch.uint8)
    scales = torch.ones(n, k // group, dtype=dtype)
    x = torch.eye(k, dtype=dtype)  # every column: each row meets all 256 (q, z) pairs
    want = values.float() - zeros.repeat_interleave(group, 1).float()
    for split in (1, 4):
        config = W4A16Config(16, 16, 16, split, num_stages=1)
        out = w4a16_gemm_triton(x, pack_int4(values), scales, zeros, group, config)
        assert torch.equal(out.float(), want.t())


# (rows, N, K, group, block_n, block_k, split, x dtype): N never a multiple of block_n but once;
# K several tiles; tiles of one group, of several, a group over several tiles; an empty split
GEMV_CASES = [(1, 40, 512, 128, 16, 128, 1, torch.bfloat16), (2, 24, 512, 64, 16, 256, 2,
              torch.float32), (3, 20, 384, 32, 8, 64, 1, torch.float16), (4, 36, 512, 128, 32, 64,
              2, torch.bfloat16), (4, 12, 256, 64, 8, 128, 3, torch.float32), (1, 16, 1024, 32, 16,
              512, 1, torch.float16), (2, 8, 256, 128, 8, 32, 1, torch.bfloat16), (3, 48, 256, 32,
              16, 32, 2, torch.float32)]
GEMV_TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}


@pytest.mark.parametrize(("m", "n", "k", "group", "block_n", "block_k", "split", "dtype"),
                         GEMV_CASES)
def test_gemv_matches_reference(m, n, k, group, block_n, block_k, split, dtype):
    """The GEMV kernel against the float32 reference of the same (rounded) inputs, written in
    x's dtype in one launch (SPLIT_K 1) or summed from float32 partials."""
    x, qweight, scales, zeros = w4a16_inputs(m, n, k, group, dtype, seed=m * n + k)
    config = W4A16Config(m, block_n, block_k, split, num_stages=1, gemv=True)
    out = w4a16_gemm_triton(x, qweight, scales, zeros, group, config)
    ref = w4a16_reference(x.float(), qweight, scales.float(), zeros, None, None, group)
    assert out.dtype == dtype and out.shape == (m, n)
    scale = max(1.0, ref.abs().max().item())
    assert (out.float() - ref).abs().max().item() <= GEMV_TOLERANCE[dtype] * scale


@pytest.mark.parametrize("m", [1, 4])
def test_gemv_is_exact_at_the_extreme_nibbles(m):
    """Nibbles 0 and 15 (words with the sign bit set), zero points 0, 15 and 8, small integer x
    and power-of-two scales: every product and partial sum is an exact float32 integer, so the
    exponent trick must give the integer result bit for bit."""
    gen = torch.Generator().manual_seed(m)
    n, k, group = 24, 256, 64
    values = torch.randint(0, 2, (n, k), generator=gen, dtype=torch.uint8) * 15
    values[:4] = torch.arange(16, dtype=torch.uint8).repeat(k // 16)  # every nibble value
    zeros = torch.tensor([0, 15, 8], dtype=torch.uint8).repeat(n * k // group)[: n * k // group]
    zeros = zeros.reshape(n, k // group)
    scales = 2.0 ** torch.randint(-2, 2, (n, k // group), generator=gen).float()
    x = torch.randint(-4, 5, (m, k), generator=gen).float()
    config = W4A16Config(m, 8, 128, 1, num_stages=1, gemv=True)
    out = w4a16_gemm_triton(x, pack_int4(values), scales, zeros, group, config)
    weight = (values.double() - zeros.double().repeat_interleave(group, 1)) * \
        scales.double().repeat_interleave(group, 1)
    assert torch.equal(out.double(), x.double() @ weight.t())


def _spy_launches(monkeypatch) -> list[str]:
    """Record which W4A16 kernel each call launches ("gemv" or "mma"), running it as usual."""
    launched: list[str] = []
    for name in ("gemv", "mma"):
        launch = getattr(w4a16_kernels_module, f"_launch_{name}")

        def spy(*args, _launch=launch, _name=name):
            launched.append(_name)
            return _launch(*args)

        monkeypatch.setattr(w4a16_kernels_module, f"_launch_{name}", spy)
    return launched


def test_op_path_takes_the_tuned_gemv_and_the_override(tmp_path, monkeypatch):
    """The op's kernel side (w4a16_kernels, as on a GPU named "GPU X") with a fake tuned file:
    its small_m entry says the GEMV wins at 1 token (nearest to 3), its tiles for 3 tokens are
    MMA ones. Act-order perm and bias go through; the override picks either kernel."""
    m, n, k, group = 3, 40, 256, 64
    x, qweight, scales, zeros = w4a16_inputs(m, n, k, group, torch.float32, seed=11)
    perm = torch.randperm(k, generator=torch.Generator().manual_seed(1))
    bias = torch.randn(n, generator=torch.Generator().manual_seed(2))
    mma = {"block_m": 16, "block_n": 16, "block_k": 64, "split_k": 2, "num_stages": 1}
    path = tmp_path / "w4a16.json"
    path.write_text(json.dumps({"devices": {"GPU X": {f"{n}x{k}": {str(m): mma}}},
                                "small_m": {"GPU X": {f"{n}x{k}": {"1": "gemv"}}}}))
    monkeypatch.setenv(w4a16_tuning.CONFIG_ENV, str(path))
    monkeypatch.delenv(w4a16_tuning.SMALL_M_ENV, raising=False)
    launched = _spy_launches(monkeypatch)
    ref = w4a16_reference(x, qweight, scales, zeros, perm, bias, group)
    for forced, kernel in ((None, "gemv"), ("tinygemm", "mma"), ("gemv", "gemv")):
        if forced:
            monkeypatch.setenv(w4a16_tuning.SMALL_M_ENV, forced)
        launched.clear()
        out = w4a16_kernels(x, qweight, scales, zeros, perm, bias, group, None, None, "GPU X")
        assert launched == [kernel], forced
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def test_gemv_entry_stays_without_tinygemm_and_mma_overrides_it(tmp_path, monkeypatch):
    """A tuned GEMV entry at 2 tokens: fp16 x (no tinygemm) runs it; forced "mma" runs the
    built-in MMA tiles instead, both matching the reference."""
    m, n, k, group = 2, 24, 256, 64
    x, qweight, scales, zeros = w4a16_inputs(m, n, k, group, torch.float16, seed=13)
    gemv = {"block_m": 2, "block_n": 16, "block_k": 128, "split_k": 1, "num_stages": 1,
            "gemv": True}
    path = tmp_path / "w4a16.json"
    path.write_text(json.dumps({"devices": {"GPU X": {f"{n}x{k}": {str(m): gemv}}},
                                "small_m": {"GPU X": {f"{n}x{k}": {str(m): "tinygemm"}}}}))
    monkeypatch.setenv(w4a16_tuning.CONFIG_ENV, str(path))
    monkeypatch.delenv(w4a16_tuning.SMALL_M_ENV, raising=False)
    launched = _spy_launches(monkeypatch)
    ref = w4a16_reference(x.float(), qweight, scales.float(), zeros, None, None, group)
    for forced, kernel in ((None, "gemv"), ("mma", "mma")):
        if forced:
            monkeypatch.setenv(w4a16_tuning.SMALL_M_ENV, forced)
        launched.clear()
        out = w4a16_kernels(x, qweight, scales, zeros, None, None, group, None, None, "GPU X")
        assert launched == [kernel], forced
        assert (out.float() - ref).abs().max().item() <= 5e-3 * max(1.0, ref.abs().max())


def test_forced_gemv_without_a_tuned_entry_uses_the_built_in_tiles(monkeypatch):
    monkeypatch.delenv(w4a16_tuning.CONFIG_ENV, raising=False)
    monkeypatch.setenv(w4a16_tuning.SMALL_M_ENV, "gemv")
    launched = _spy_launches(monkeypatch)
    x, qweight, scales, zeros = w4a16_inputs(2, 24, 512, 128, torch.bfloat16, seed=5)
    out = w4a16_kernels(x, qweight, scales, zeros, None, None, 128, None, None, "GPU Y")
    ref = w4a16_reference(x.float(), qweight, scales.float(), zeros, None, None, 128)
    assert launched == ["gemv"] and out.dtype == torch.bfloat16
    assert (out.float() - ref).abs().max().item() <= 8e-3 * max(1.0, ref.abs().max().item())


@pytest.mark.parametrize("m", [3, 40])
def test_fp8_block_matches_reference(m):
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, 256, generator=gen)
    weight = torch.randn(72, 256, generator=gen).to(torch.float8_e4m3fn)
    scale = torch.rand(72, 2, generator=gen) * 0.01
    torch.testing.assert_close(fp8_block_gemm_triton(x, weight, scale),
                               fp8_block_reference(x, weight, scale, None), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("m_major", [False, True])
@pytest.mark.parametrize(("m", "k"), [(1, 384), (5, 1280)])
def test_fp8_group_quant_kernel_equals_torch(m, k, m_major):
    """One launch gives quant_fp8_groups' bytes and scales, in either scale layout (groups
    past a program's last whole group masked; a zero group takes the floor scale)."""
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k)) * 3
    x[0, :128] = 0.0
    q, scale = quant_fp8_groups_triton(x, m_major=m_major)
    want_q, want_scale = quant_fp8_groups(x)
    assert scale.stride() == ((1, m) if m_major else (k // 128, 1))
    assert torch.equal(scale, want_scale)
    got, want = q.float(), want_q.float()
    if x.is_cuda:
        assert torch.equal(got, want)
        return
    # Triton's interpreter drops the carry when rounding up to a binade's top (124.3 -> 64,
    # not 128); the hardware conversion does not (the GPU runs this case exactly)
    off = got != want
    assert torch.equal(got[off] * 2, want[off])
    assert torch.equal(want[off].abs().log2(), want[off].abs().log2().round())
