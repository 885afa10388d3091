"""The one-launch decode (QK-norm + RoPE + KV write inside split decode attention) on the GPU, bf16,
at Llama-3-8B and Qwen3 head shapes, against the two kernels it replaces: caches equal but for
rare 1-ulp norm roundings (another reduction order), outputs within bf16 rounding (the newest
key is folded in last, from registers), at short and long contexts, padded sequences, and
inside a CUDA graph replayed on new inputs."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.batches import pad_decode
from tests.kernels.test_qk_norm_rope_gpu import SHAPES, _inputs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _assert_close(one, two, one_cache, two_cache):
    """Caches: at most 1 in 1,000 values 1 ulp apart; outputs: 0.5% relative error."""
    assert (one_cache != two_cache).float().mean() < 1e-3
    torch.testing.assert_close(one_cache, two_cache, rtol=8e-3, atol=1e-5)
    assert ((one.float() - two.float()).norm() / two.float().norm()).item() < 5e-3
    assert (one != two).float().mean() < 0.1


def _two_and_one(batch, cos, sin, q_w, k_w):
    """(two-kernel output and cache, one-launch output and cache) from copies of one cache."""
    from compiled_llm.attention.triton_backend import (
        triton_attention,
        triton_fused_decode,
        triton_fused_write,
    )

    two_cache, one_cache = batch.kv_cache.clone(), batch.kv_cache.clone()
    q_rot, k_rot = triton_fused_write(batch.q, batch.k, batch.v, cos, sin, q_w, k_w, 1e-6,
                                      two_cache, batch.meta, None)
    two = triton_attention(q_rot, k_rot, batch.v, two_cache, batch.meta, 0.088, -1,
                           write_kv=False)
    one = triton_fused_decode(batch.q, batch.k, batch.v, cos, sin, q_w, k_w, 1e-6, one_cache,
                              batch.meta, 0.088, -1)
    return two, two_cache, one, one_cache


@pytest.mark.parametrize("hq, hkv, norms", SHAPES)
@pytest.mark.parametrize("ctx", [5, 300, 3000])
def test_matches_the_two_kernels(hq, hkv, norms, ctx):
    batch, cos, sin, q_w, k_w = _inputs([1] * 4, [ctx, 0, ctx // 2, 17], hq, hkv, norms, seed=1)
    batch = pad_decode(batch, 3)
    cos, sin = torch.cat([cos, cos[:3]]), torch.cat([sin, sin[:3]])
    two, two_cache, one, one_cache = _two_and_one(batch, cos, sin, q_w, k_w)
    _assert_close(one, two, one_cache, two_cache)
    assert not one[4:].any()  # padded sequences


@pytest.mark.parametrize("hq, hkv, norms", SHAPES)
def test_in_a_cuda_graph(hq, hkv, norms):
    from compiled_llm.attention.triton_backend import triton_fused_decode

    batch, cos, sin, q_w, k_w = _inputs([1] * 8, [200] * 8, hq, hkv, norms, seed=4)
    cache, expected_inputs = batch.kv_cache, _inputs([1] * 8, [200] * 8, hq, hkv, norms, seed=5)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # warm up (compile) outside the capture
        triton_fused_decode(batch.q, batch.k, batch.v, cos, sin, q_w, k_w, 1e-6, cache.clone(),
                            batch.meta, 0.088, -1)
    torch.cuda.current_stream().wait_stream(stream)
    before = cache.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = triton_fused_decode(batch.q, batch.k, batch.v, cos, sin, q_w, k_w, 1e-6, cache,
                                  batch.meta, 0.088, -1)
    fresh = expected_inputs[0]
    for name in ("q", "k", "v"):  # new step inputs, same buffers
        getattr(batch, name).copy_(getattr(fresh, name))
    cache.copy_(before)
    graph.replay()
    torch.cuda.synchronize()
    batch.kv_cache = before
    two, two_cache, _, _ = _two_and_one(batch, cos, sin, q_w, k_w)
    _assert_close(out, two, cache, two_cache)


@pytest.mark.parametrize("batch_size", [3, 64, 200])
def test_longest_first_launch_order_changes_nothing(batch_size):
    """The metadata's decode order (longest context first) on both decode kernels: outputs
    and caches bit for bit the grid order's, at mixed contexts and with splits (batch 3)."""
    from dataclasses import replace

    from compiled_llm.attention.triton_backend import triton_attention, triton_fused_decode

    gen = torch.Generator().manual_seed(batch_size)
    ctx = torch.randint(100, 2048, (batch_size,), generator=gen).tolist()
    batch, cos, sin, q_w, k_w = _inputs([1] * batch_size, ctx, 32, 8, False, seed=6)
    order = torch.argsort(batch.meta.seq_lens, descending=True, stable=True).int()
    ordered = replace(batch.meta, decode_order=order)
    outs, caches = [], []
    for meta in (batch.meta, ordered):
        cache = batch.kv_cache.clone()
        outs.append(triton_fused_decode(batch.q, batch.k, batch.v, cos, sin, q_w, k_w, 1e-6,
                                        cache, meta, 0.088, -1))
        outs.append(triton_attention(batch.q, batch.k, batch.v, cache, meta, 0.088, -1))
        caches.append(cache)
    assert torch.equal(outs[0], outs[2]) and torch.equal(outs[1], outs[3])
    assert torch.equal(caches[0], caches[1]) and outs[0].abs().sum() > 0
