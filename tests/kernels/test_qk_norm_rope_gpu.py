"""The fused QK-norm + RoPE + KV-write kernel on the GPU, bf16, at Llama-3-8B (32 q / 8 KV heads,
no q/k norm) and Qwen3 (16 or 32 q / 8 KV heads, q/k norms) head shapes, against the reference
(the models' unfused math and the reference write): decode and prefill token counts, padded
rows, FP8 caches byte for byte, and a decode step captured in a CUDA graph and replayed."""

from __future__ import annotations

import pytest
import torch

from compiled_llm.attention.qk_norm_rope import qk_norm_rope_ref, reference_fused_write
from tests.kernels.batches import make_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

# (q heads, KV heads, q/k norms): Llama-3-8B, Qwen3-0.6B, Qwen3-8B; head_dim 128 for all
SHAPES = [(32, 8, False), (16, 8, True), (32, 8, True)]


def _inputs(q_lens, ctx_lens, hq, hkv, norms, pad_rows=0, seed=0, dtype=torch.bfloat16):
    batch = make_batch(q_lens, ctx_lens, hq, hkv, 128, dtype=dtype, device="cuda",
                       pad_rows=pad_rows, seed=seed)
    batch.kv_cache.nan_to_num_(0.0)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    num_tokens = batch.q.shape[0]
    pos = torch.randint(0, 8192, (num_tokens,), device="cuda", generator=gen).float()
    inv_freq = 1.0 / 500000.0 ** (torch.arange(0, 128, 2, device="cuda").float() / 128)
    freqs = torch.outer(pos, inv_freq)[:, None]
    cos, sin = torch.cat([freqs.cos()] * 2, -1), torch.cat([freqs.sin()] * 2, -1)
    weights = (1 + 0.2 * torch.randn(2, 128, device="cuda", generator=gen)).to(dtype) \
        if norms else (None, None)
    return batch, cos, sin, weights[0], weights[1]


def _fused():
    from compiled_llm.attention.triton_backend import triton_fused_write

    return triton_fused_write


def _rel_err(out, ref) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


@pytest.mark.parametrize("hq, hkv, norms", SHAPES)
@pytest.mark.parametrize("q_lens, ctx_lens", [([1] * 32, list(range(5, 37))),
                                              ([1], [4000]), ([700, 1, 33], [0, 90, 16])])
def test_kernel_matches_reference_bf16(hq, hkv, norms, q_lens, ctx_lens):
    batch, cos, sin, q_w, k_w = _inputs(q_lens, ctx_lens, hq, hkv, norms, pad_rows=3)
    ref_cache = batch.kv_cache.clone()
    ref_q, ref_k = reference_fused_write(batch.q, batch.k, batch.v, cos, sin, q_w, k_w, 1e-6,
                                         ref_cache, batch.meta, None)
    q_out, k_out = _fused()(batch.q, batch.k, batch.v, cos, sin, q_w, k_w, 1e-6,
                            batch.kv_cache, batch.meta, None)
    rows = batch.meta.num_actual_tokens
    assert _rel_err(q_out, ref_q) < 8e-3 and _rel_err(k_out[:rows], ref_k[:rows]) < 8e-3
    assert _rel_err(batch.kv_cache, ref_cache) < 8e-3
    slots = batch.meta.slot_mapping[:rows]
    # v is copied, not computed: its rows are bit-equal
    assert torch.equal(batch.kv_cache[1].flatten(0, 1)[slots], batch.v[:rows])


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_cache_bytes_match_reference(dtype):
    batch, cos, sin, q_w, k_w = _inputs([1] * 8, [10] * 8, 32, 8, True, dtype=torch.float32)
    cache = batch.kv_cache.to(dtype)
    ref_cache = cache.clone()
    scales = torch.rand(2, 8, device="cuda") + 0.1
    reference_fused_write(batch.q, batch.k, batch.v, cos, sin, q_w, k_w, 1e-6, ref_cache,
                          batch.meta, scales)
    _fused()(batch.q, batch.k, batch.v, cos, sin, q_w, k_w, 1e-6, cache, batch.meta, scales)
    slots = batch.meta.slot_mapping[: batch.meta.num_actual_tokens]
    ours = cache.flatten(1, 2)[:, slots].view(torch.uint8)
    ref = ref_cache.flatten(1, 2)[:, slots].view(torch.uint8)
    # float32 inputs: the kernel's single rounding of k may differ from the reference's by one
    # FP8 step on a few values; v (a plain scaled copy) must match every byte
    assert torch.equal(ours[1], ref[1])
    assert (ours[0] != ref[0]).float().mean() < 0.01


@pytest.mark.parametrize("hq, hkv, norms", SHAPES)
def test_decode_step_in_a_cuda_graph(hq, hkv, norms):
    batch, cos, sin, q_w, k_w = _inputs([1] * 8, [20] * 8, hq, hkv, norms, seed=4)
    fused, cache = _fused(), batch.kv_cache
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # warm up (compile) outside the capture
        fused(batch.q, batch.k, batch.v, cos, sin, q_w, k_w, 1e-6, cache.clone(), batch.meta,
              None)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q_out, _ = fused(batch.q, batch.k, batch.v, cos, sin, q_w, k_w, 1e-6, cache,
                         batch.meta, None)
    fresh, *_ = _inputs([1] * 8, [20] * 8, hq, hkv, norms, seed=5)
    for name in ("q", "k", "v"):  # new step inputs, same buffers
        getattr(batch, name).copy_(getattr(fresh, name))
    graph.replay()
    torch.cuda.synchronize()
    ref_q, _ = qk_norm_rope_ref(batch.q, batch.k, cos, sin, q_w, k_w, 1e-6)
    assert _rel_err(q_out, ref_q) < 8e-3
    slots = batch.meta.slot_mapping[: batch.meta.num_actual_tokens]
    assert torch.equal(cache[1].flatten(0, 1)[slots], batch.v[: slots.shape[0]])
