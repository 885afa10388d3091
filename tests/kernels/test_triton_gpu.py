"""Triton attention kernels on the GPU at real shapes (Llama-3-8B heads: 32 q, 8 KV, head_dim
128; block_size 16), against SDPA and the reference backend; the decode path in a CUDA graph."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.kernels.batches import make_batch, pad_decode, reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

HQ, HKV, D = 32, 8, 128
SCALE = D**-0.5


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.float(), ref.float()
    assert not out.isnan().any(), "NaN in the output"
    return ((out - ref).norm() / ref.norm()).item()


def _backend(batch, window=-1):
    from compiled_llm.attention.triton_backend import triton_attention

    return triton_attention(batch.q, batch.k, batch.v, batch.kv_cache, batch.meta, SCALE, window)


@pytest.mark.parametrize("seq_len", [1024, 4096, 16384])
def test_prefill_matches_sdpa(seq_len):
    batch = make_batch([seq_len], [0], HQ, HKV, D, dtype=torch.bfloat16, device="cuda")
    out = _backend(batch)
    q = batch.q.transpose(0, 1)[None]  # [1, Hq, L, D]
    k = batch.k.transpose(0, 1)[None].repeat_interleave(HQ // HKV, dim=1)
    v = batch.v.transpose(0, 1)[None].repeat_interleave(HQ // HKV, dim=1)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=SCALE)[0].transpose(0, 1)
    assert _rel_err(out, ref) < 1.5e-2


@pytest.mark.parametrize("decodes_first", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_mixed_chunked_batch_matches_reference(head_dim, decodes_first):
    # chunks with cached context, fresh prefills and decodes in one flat batch; decodes first
    # (as the scheduler lists them) take the decode kernel
    q_lens = [2048, 1, 517, 1, 1, 3000]
    ctx_lens = [6000, 9000, 0, 15, 16000, 1024]
    if decodes_first:
        q_lens, ctx_lens = [1, 1, 1, 2048, 517, 1, 3000], [9000, 15, 16000, 6000, 0, 700, 1024]
    batch = make_batch(q_lens, ctx_lens, HQ, HKV, head_dim, dtype=torch.bfloat16, device="cuda",
                       pad_rows=5, seed=1)
    ref, ref_cache = reference(batch, head_dim**-0.5, -1)
    from compiled_llm.attention.triton_backend import triton_attention

    out = triton_attention(batch.q, batch.k, batch.v, batch.kv_cache, batch.meta,
                           head_dim**-0.5, -1)
    assert _rel_err(out[:-5], ref[:-5]) < 1.5e-2
    assert torch.equal(out[-5:], torch.zeros_like(out[-5:]))
    assert torch.equal(torch.nan_to_num(batch.kv_cache.float()), ref_cache)


@pytest.mark.parametrize("head_dim,window", [(128, -1), (256, 4096)])  # Gemma 2's head_dim
def test_soft_capped_mixed_batch_matches_reference(head_dim, window):
    # Gemma 2's attention (cap 50) on the decode and prefill kernels, against the reference
    from compiled_llm.attention.reference import attention_forward
    from compiled_llm.attention.triton_backend import triton_attention

    batch = make_batch([1, 1, 2048, 517, 1], [9000, 15, 6000, 0, 5000], 8, 4, head_dim,
                       dtype=torch.bfloat16, device="cuda", seed=3)
    batch.q.mul_(8.0)  # scores past the cap, so that it bites
    cache = torch.nan_to_num(batch.kv_cache)
    ref = attention_forward(*(x.float() for x in (batch.q, batch.k, batch.v, cache)),
                            batch.meta, head_dim**-0.5, window, softcap=50.0)
    out = triton_attention(batch.q, batch.k, batch.v, cache, batch.meta, head_dim**-0.5,
                           window, softcap=50.0)
    assert _rel_err(out, ref) < 1.5e-2


@pytest.mark.parametrize("window", [-1, 128])
def test_sinks_mixed_and_decode_batches_match_reference(window):
    # GPT-OSS's attention (head_dim 64, a sink logit per head, windows of 128) on the decode
    # kernel (one split starts from the sinks; long contexts merge many) and the prefill kernel
    from compiled_llm.attention.reference import attention_forward
    from compiled_llm.attention.triton_backend import triton_attention

    sinks = torch.linspace(-4.0, 12.0, 8, device="cuda", dtype=torch.bfloat16)
    mixed, decode = ([1, 1, 2048, 517, 1], [9000, 15, 6000, 0, 5000]), ([1] * 4, [9000, 1, 700, 64])
    for q_lens, ctx in (mixed, decode):
        batch = make_batch(q_lens, ctx, 8, 1, 64, dtype=torch.bfloat16, device="cuda", seed=5)
        cache = torch.nan_to_num(batch.kv_cache)
        ref = attention_forward(*(x.float() for x in (batch.q, batch.k, batch.v, cache)),
                                batch.meta, 0.125, window, sinks=sinks.float())
        out = triton_attention(batch.q, batch.k, batch.v, cache, batch.meta, 0.125, window,
                               sinks=sinks)
        assert _rel_err(out, ref) < 1.5e-2


def test_alibi_mixed_and_decode_batches_match_reference():
    # Bloom's attention (16 heads of 64, ALiBi slopes 2^-0.5 .. 2^-8, no window) on the
    # decode and prefill kernels over long contexts: the bias reaches thousands
    from compiled_llm.attention.reference import attention_forward
    from compiled_llm.attention.triton_backend import triton_attention

    slopes = 2.0 ** -torch.arange(0.5, 8.5, 0.5, device="cuda")
    mixed, decode = ([1, 1, 2048, 517, 1], [9000, 15, 6000, 0, 5000]), ([1] * 4, [9000, 1, 700, 64])
    for q_lens, ctx in (mixed, decode):
        batch = make_batch(q_lens, ctx, 16, 16, 64, dtype=torch.bfloat16, device="cuda", seed=6)
        cache = torch.nan_to_num(batch.kv_cache)
        ref = attention_forward(*(x.float() for x in (batch.q, batch.k, batch.v, cache)),
                                batch.meta, 0.125, -1, alibi_slopes=slopes)
        out = triton_attention(batch.q, batch.k, batch.v, cache, batch.meta, 0.125, -1,
                               alibi_slopes=slopes)
        assert _rel_err(out, ref) < 1.5e-2


@pytest.mark.parametrize("window", [512, 4096])
def test_sliding_window_prefill_and_decode(window):
    batch = make_batch([3000, 1, 700], [5000, 8000, 0], HQ, HKV, D, dtype=torch.bfloat16,
                       device="cuda", seed=2)
    ref, _ = reference(batch, SCALE, window)
    assert _rel_err(_backend(batch, window), ref) < 1.5e-2
    decode = make_batch([1] * 8, [100, 9000, 4095, 4096, 4097, 16000, 1, 600], HQ, HKV, D,
                        dtype=torch.bfloat16, device="cuda", seed=3)
    ref, _ = reference(decode, SCALE, window)
    assert _rel_err(_backend(decode, window), ref) < 1.5e-2


@pytest.mark.parametrize("batch_size", [1, 32])
def test_decode_matches_reference(batch_size):
    gen = torch.Generator().manual_seed(batch_size)
    ctx = torch.randint(1, 16384, (batch_size,), generator=gen).tolist()
    batch = make_batch([1] * batch_size, ctx, HQ, HKV, D, dtype=torch.bfloat16, device="cuda")
    ref, _ = reference(batch, SCALE, -1)
    assert _rel_err(_backend(batch), ref) < 1.5e-2


def _copy_meta(dst, src) -> None:
    """Refill static metadata buffers in place (what the runner does before a graph replay)."""
    n = src.seq_lens.shape[0]
    dst.seq_lens.zero_()
    dst.seq_lens[:n].copy_(src.seq_lens)
    dst.block_tables.zero_()
    dst.block_tables[:n, : src.block_tables.shape[1]].copy_(src.block_tables)
    dst.slot_mapping.fill_(-1)
    dst.slot_mapping[:n].copy_(src.slot_mapping)


def test_decode_path_captures_in_cuda_graph():
    from compiled_llm.attention.triton_backend import triton_attention

    # static buffers for 16 sequences and up to 4096 tokens each; 11 real ones per step
    width, num_blocks = 4096 // 16, 16 * (4096 // 16) + 1
    static = pad_decode(make_batch([1] * 4, [30] * 4, HQ, HKV, D, dtype=torch.bfloat16,
                                   device="cuda"), 12)
    static.meta.block_tables = torch.zeros(16, width, dtype=torch.int32, device="cuda")
    cache = torch.zeros(2, num_blocks, 16, HKV, D, dtype=torch.bfloat16, device="cuda")
    q, k, v = (torch.zeros(16, h, D, dtype=torch.bfloat16, device="cuda") for h in (HQ, HKV, HKV))
    run = lambda: triton_attention(q, k, v, cache, static.meta, SCALE, -1)  # noqa: E731
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        run()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for seed in (5, 6):
        gen = torch.Generator().manual_seed(seed)
        ctx = torch.randint(1, 4000, (11,), generator=gen).tolist()
        step = make_batch([1] * 11, ctx, HQ, HKV, D, dtype=torch.bfloat16, device="cuda",
                          seed=seed)
        nb = step.kv_cache.shape[1]
        cache.zero_()
        cache[:, :nb].copy_(torch.nan_to_num(step.kv_cache))
        _copy_meta(static.meta, step.meta)
        for dst, src in ((q, step.q), (k, step.k), (v, step.v)):
            dst.zero_()
            dst[:11].copy_(src)
        graph.replay()
        ref, _ = reference(step, SCALE, -1)
        assert _rel_err(out[:11], ref) < 1.5e-2
        assert torch.equal(out[11:], torch.zeros_like(out[11:]))


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_cache_write_and_mixed_batch(fp8):
    from compiled_llm.attention.triton_backend import triton_attention
    from tests.kernels.batches import fp8_batch, fp8_reference

    batch = make_batch([2048, 1, 517, 1, 3000], [6000, 9000, 0, 15, 1024], HQ, HKV, D,
                       dtype=torch.bfloat16, device="cuda", pad_rows=5, seed=2)
    exact, _ = reference(batch, SCALE, -1)
    batch, scales = fp8_batch(batch, fp8)
    ref, ref_cache = fp8_reference(batch, scales, SCALE, -1)
    out = triton_attention(batch.q, batch.k, batch.v, batch.kv_cache, batch.meta, SCALE, -1,
                           kv_scales=scales)
    slots = batch.meta.slot_mapping[: batch.meta.num_actual_tokens]
    written = batch.kv_cache.view(torch.uint8).flatten(1, 2)[:, slots]
    assert torch.equal(written, ref_cache.view(torch.uint8).flatten(1, 2)[:, slots])
    assert _rel_err(out[:-5], ref[:-5]) < 1.5e-2  # the same FP8 cache, read by the reference
    assert _rel_err(out[:-5], exact[:-5]) < (5e-2 if fp8 is torch.float8_e4m3fn else 0.1)


def test_fp8_decode_in_a_cuda_graph():
    from compiled_llm.attention.triton_backend import triton_attention
    from tests.kernels.batches import fp8_batch, fp8_reference

    batch, scales = fp8_batch(pad_decode(make_batch([1] * 6, [5, 900, 33, 4000, 1, 16], HQ, HKV,
                                                    D, dtype=torch.bfloat16, device="cuda",
                                                    seed=3), 2))
    ref, _ = fp8_reference(batch, scales, SCALE, -1)
    graph, out = torch.cuda.CUDAGraph(), None
    triton_attention(batch.q, batch.k, batch.v, batch.kv_cache.clone(), batch.meta, SCALE, -1,
                     kv_scales=scales)  # compile outside the capture
    with torch.cuda.graph(graph):
        out = triton_attention(batch.q, batch.k, batch.v, batch.kv_cache, batch.meta, SCALE, -1,
                               kv_scales=scales)
    graph.replay()
    assert _rel_err(out[:6], ref[:6]) < 1.5e-2


def test_decode_merges_in_one_launch(monkeypatch):
    """The split path's last program merges (no second kernel): the two-kernel merge's bits, the
    counters back at zero, and replays of a captured graph alike (short contexts: near-empty
    splits arrive together)."""
    from compiled_llm.attention.kernels import decode
    from compiled_llm.attention.triton_backend import triton_attention
    from compiled_llm.gemm import arrival

    batch = make_batch([1] * 3, [9000, 5, 700], HQ, HKV, D, dtype=torch.bfloat16, device="cuda",
                       seed=4)
    ref, _ = reference(batch, SCALE, -1)
    run = lambda: triton_attention(batch.q, batch.k, batch.v, batch.kv_cache,  # noqa: E731
                                   batch.meta, SCALE, -1)
    monkeypatch.setattr(arrival, "ONE_LAUNCH", True)  # opt-in: COMPILED_LLM_ONE_LAUNCH_SPLITS=1
    monkeypatch.setattr(decode, "_decode_reduce_kernel", None)  # launching it would fail
    fused = run()
    counters = arrival.arrival_counters(fused.device)
    assert not counters.any()
    assert _rel_err(fused, ref) < 1.5e-2
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    mismatches = torch.zeros((), dtype=torch.int64, device="cuda")
    for _ in range(200):
        graph.replay()
        mismatches += (out != fused).sum()
    assert mismatches.item() == 0
    assert not counters.any()
    monkeypatch.undo()
    monkeypatch.setattr(decode, "merge_counters", lambda device, config: None)
    # the two kernels' merge compiles to other instructions: close, not bit-equal (call 35)
    assert _rel_err(run(), fused) < 1e-2
