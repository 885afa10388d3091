"""FP8 KV-cache kernels against the reference backend, run by test_interpreter.py in a subprocess
with TRITON_INTERPRET=1: scaled writes byte for byte, prefill and decode over scaled FP8 caches
close to the reference's float32 reading of the same cache.

The interpreter's float32 -> FP8 conversion rounds values that carry into the next binade
(31.9 -> 16, not 32) wrongly; the write test leaves those few out (the GPU converts in hardware:
test_triton_gpu checks every byte), and the read tests take the reference's written cache."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.attention.kernels import (
    DecodeConfig,
    PrefillConfig,
    decode_attention,
    kernels_interpreted,
    prefill_attention,
    write_kv_cache,
)
from compiled_llm.attention.kernels import decode as decode_module
from compiled_llm.gemm import arrival
from tests.kernels.batches import fp8_batch, fp8_reference, make_batch

pytestmark = pytest.mark.skipif(not kernels_interpreted(), reason="needs TRITON_INTERPRET=1")

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
SCALE = 0.3


def _close(out, ref):
    assert not out.isnan().any(), "NaN: a kernel read a poisoned (unused) block"
    err = (out.float() - ref).abs().max().item()
    assert err <= 2e-5 * max(1.0, ref.abs().max().item()), err


def _take_written(batch, ref_cache):
    """This step's rows as the reference wrote them; the rest of the cache (NaN) untouched."""
    slots = batch.meta.slot_mapping[: batch.meta.num_actual_tokens]
    flat = batch.kv_cache.view(torch.uint8).flatten(1, 2)
    flat[:, slots] = ref_cache.view(torch.uint8).flatten(1, 2)[:, slots]


@pytest.mark.parametrize("dtype", FP8)
def test_scaled_write_matches_reference_bytes(dtype):
    batch, scales = fp8_batch(make_batch([5, 1, 19], [0, 9, 3], 4, 2, 32, pad_rows=3), dtype)
    _, ref_cache = fp8_reference(batch, scales, SCALE, -1)
    write_kv_cache(batch.k, batch.v, batch.kv_cache, batch.meta.slot_mapping, scales)
    slots = batch.meta.slot_mapping[: batch.meta.num_actual_tokens]
    ours = batch.kv_cache.flatten(1, 2)[:, slots]
    ref = ref_cache.flatten(1, 2)[:, slots]
    rows = torch.stack([batch.k, batch.v])[:, : slots.shape[0]].float() / scales[:, None, :, None]
    carried = (ref.float().abs() > rows.abs()) & (ref.float().abs().log2().frac() == 0)
    assert carried.float().mean() < 0.15  # e5m2: 2 mantissa bits, more carries
    assert torch.equal(ours.view(torch.uint8)[~carried], ref.view(torch.uint8)[~carried])


@pytest.mark.parametrize("dtype", FP8)
@pytest.mark.parametrize("window", [-1, 7])
def test_prefill_over_fp8_cache(dtype, window):
    batch, scales = fp8_batch(make_batch([9, 1, 20], [4, 33, 0], 4, 2, 32, seed=2), dtype)
    ref, ref_cache = fp8_reference(batch, scales, SCALE, window)
    m = batch.meta
    _take_written(batch, ref_cache)
    out = prefill_attention(batch.q, batch.kv_cache, m.query_start_loc, m.seq_lens,
                            m.block_tables, m.max_query_len, SCALE, window,
                            torch.zeros_like(batch.q),
                            PrefillConfig(block_m=32, block_n=16, num_warps=4, num_stages=1),
                            scales)
    _close(out, ref)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_over_fp8_cache(num_splits, monkeypatch):
    batch, scales = fp8_batch(make_batch([1, 1, 1], [17, 80, 2], 8, 2, 32, seed=3))
    ref, ref_cache = fp8_reference(batch, scales, SCALE, -1)
    m = batch.meta
    _take_written(batch, ref_cache)

    def run():
        return decode_attention(batch.q, batch.kv_cache, m.seq_lens, m.block_tables, SCALE, -1,
                                torch.full_like(batch.q, float("nan")),
                                DecodeConfig(block_n=16, num_warps=4, num_stages=1, max_splits=8),
                                num_splits=num_splits, kv_scales=scales)

    monkeypatch.setattr(arrival, "ONE_LAUNCH", True)  # the opt-in one-launch merge
    out = run()
    _close(out, ref)
    assert not arrival.arrival_counters(out.device).any()
    monkeypatch.setattr(decode_module, "merge_counters", lambda device, config: None)
    assert torch.equal(run(), out)  # the two-kernel merge's result
