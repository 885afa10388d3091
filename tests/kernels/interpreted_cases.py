"""Kernel checks against the torch reference, run by test_interpreter.py in a subprocess with
TRITON_INTERPRET=1 (CPU tensors, small shapes). Not collected directly: see that file.

fp16 and fp32 for attention; the interpreter's tl.dot mishandles bf16 (bf16 is checked on the
GPU), while bf16 cache writes are checked here.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from compiled_llm.attention import attention
from compiled_llm.attention.forward_context import ForwardContext, set_forward_context
from compiled_llm.attention.kernels import (
    DecodeConfig,
    PrefillConfig,
    choose_num_splits,
    decode_attention,
    kernels_interpreted,
    prefill_attention,
    write_kv_cache,
)
from compiled_llm.attention.kernels import decode as decode_module
from compiled_llm.gemm import arrival
from tests.kernels.batches import make_batch, pad_decode, reference, tolerance

pytestmark = pytest.mark.skipif(not kernels_interpreted(), reason="needs TRITON_INTERPRET=1")

SMALL_PREFILL = PrefillConfig(block_m=32, block_n=16, num_warps=4, num_stages=1)
SMALL_DECODE = DecodeConfig(block_n=16, num_warps=4, num_stages=1, max_splits=8)
SCALE = 0.3


def _prefill(batch, window, config=SMALL_PREFILL):
    m = batch.meta
    write_kv_cache(batch.k, batch.v, batch.kv_cache, m.slot_mapping)
    out = torch.zeros_like(batch.q)
    return prefill_attention(batch.q, batch.kv_cache, m.query_start_loc, m.seq_lens,
                             m.block_tables, m.max_query_len, SCALE, window, out, config)


def _decode(batch, window, num_splits, config=SMALL_DECODE, order=None):
    m = batch.meta
    write_kv_cache(batch.k, batch.v, batch.kv_cache, m.slot_mapping)
    out = torch.full_like(batch.q, float("nan"))
    return decode_attention(batch.q, batch.kv_cache, m.seq_lens, m.block_tables, SCALE, window,
                            out, config, num_splits=num_splits, order=order)


def _assert_close(out, ref, dtype, rows=None):
    out, ref = out.float()[:rows], ref[:rows]
    assert not out.isnan().any(), "NaN: a kernel read a poisoned (unused) block"
    err = (out - ref).abs().max().item()
    assert err <= tolerance(dtype) * max(1.0, ref.abs().max().item()), err


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_write_skips_negative_slots(dtype):
    batch = make_batch([5, 1, 19], [0, 9, 3], 4, 2, 32, dtype=dtype, pad_rows=3)
    before = batch.kv_cache.clone()
    write_kv_cache(batch.k, batch.v, batch.kv_cache, batch.meta.slot_mapping)
    _, ref_cache = reference(batch, SCALE, -1)
    flat = batch.kv_cache.flatten(1, 2)  # [2, slots, Hkv, D]
    slots = batch.meta.slot_mapping[: batch.meta.num_actual_tokens]
    torch.testing.assert_close(flat[0, slots], batch.k[: slots.shape[0]], rtol=0, atol=0)
    torch.testing.assert_close(flat[1, slots], batch.v[: slots.shape[0]], rtol=0, atol=0)
    untouched = torch.ones(flat.shape[1], dtype=torch.bool)
    untouched[slots] = False
    torch.testing.assert_close(flat[:, untouched], before.flatten(1, 2)[:, untouched],
                               equal_nan=True, rtol=0, atol=0)
    assert torch.equal(torch.nan_to_num(batch.kv_cache.float()), ref_cache)


@pytest.mark.parametrize("gqa", [1, 2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_prefill_mixed_batch(gqa, dtype):
    # prefills, a chunk with cached context, and decodes in one flat batch
    batch = make_batch([23, 1, 40, 1, 7], [0, 30, 21, 5, 50], 2 * gqa, 2, 32, dtype=dtype,
                       seed=gqa)
    ref, _ = reference(batch, SCALE, -1)
    _assert_close(_prefill(batch, -1), ref, dtype)


@pytest.mark.parametrize("d", [16, 64])
def test_prefill_head_dims_and_default_tiles(d):
    batch = make_batch([70, 3], [0, 90], 4, 2, d, seed=d)
    ref, _ = reference(batch, SCALE, -1)
    config = PrefillConfig(block_m=128, block_n=64, num_warps=4, num_stages=1)
    _assert_close(_prefill(batch, -1, config), ref, torch.float32)


def test_prefill_short_chunks_shrink_tiles():
    # max_query_len 3 x GQA 4: 16-row tiles instead of the default 128
    batch = make_batch([3, 1, 2, 3], [0, 44, 17, 29], 8, 2, 32, seed=9)
    ref, _ = reference(batch, SCALE, -1)
    _assert_close(_prefill(batch, -1, PrefillConfig()), ref, torch.float32)


@pytest.mark.parametrize("window", [1, 5, 16, 37])
def test_prefill_sliding_window_chunked(window):
    batch = make_batch([33, 1, 12], [40, 60, 0], 4, 1, 16, dtype=torch.float16, seed=window)
    ref, _ = reference(batch, SCALE, window)
    _assert_close(_prefill(batch, window), ref, torch.float16)


@pytest.mark.parametrize("num_splits", [1, 3, 8])
@pytest.mark.parametrize("gqa", [1, 4])
def test_decode_split_k(num_splits, gqa):
    batch = make_batch([1, 1, 1, 1], [70, 3, 129, 16], 2 * gqa, 2, 32, seed=num_splits)
    ref, _ = reference(batch, SCALE, -1)
    _assert_close(_decode(batch, -1, num_splits), ref, torch.float32)


@pytest.mark.parametrize("window", [4, 50])
def test_decode_sliding_window_fp16(window):
    batch = make_batch([1, 1, 1], [90, 20, 7], 4, 2, 32, dtype=torch.float16, seed=window)
    ref, _ = reference(batch, SCALE, window)
    _assert_close(_decode(batch, window, 4), ref, torch.float16)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_padded_sequences_write_zeros(num_splits):
    real = make_batch([1, 1], [40, 9], 4, 2, 16, seed=3)
    ref, _ = reference(real, SCALE, -1)
    batch = pad_decode(real, 3)
    out = _decode(batch, -1, num_splits)
    _assert_close(out, ref, torch.float32, rows=2)
    assert torch.equal(out[2:], torch.zeros_like(out[2:]))


@pytest.mark.parametrize("num_splits,window", [(None, -1), (3, -1), (8, -1), (4, 30)])
def test_decode_merges_splits_in_one_launch(num_splits, window, monkeypatch):
    # the last split of each (sequence, KV head) merges: no second kernel, the counters back at
    # zero, a rerun alike, and the two-kernel merge's result bit for bit (5 tokens: empty splits)
    batch = make_batch([1, 1, 1], [100, 5, 47], 8, 2, 32, seed=7)
    ref, _ = reference(batch, SCALE, window)
    monkeypatch.setattr(arrival, "ONE_LAUNCH", True)  # opt-in (COMPILED_LLM_...=1)
    counters = arrival.arrival_counters(batch.q.device)
    monkeypatch.setattr(decode_module, "_decode_reduce_kernel", None)  # launching it would fail
    first = _decode(batch, window, num_splits)
    assert not counters.any()
    assert torch.equal(_decode(batch, window, num_splits), first)
    _assert_close(first, ref, torch.float32)
    monkeypatch.undo()
    too_narrow = torch.zeros(5, dtype=torch.int32)  # 3 sequences x 2 KV heads do not fit
    monkeypatch.setattr(decode_module, "merge_counters", lambda device, config: too_narrow)
    assert torch.equal(_decode(batch, window, num_splits), first)
    assert not too_narrow.any()


@pytest.mark.parametrize("in_launch", [False, True])
@pytest.mark.parametrize("window", [-1, 30])
def test_decode_uses_a_split_per_split_keys(in_launch, window):
    # 101, 6 and 48 keys at split_keys=32 on a grid of 8 splits use 4, 1 and 2 splits (a window
    # of 30: one each): each row as a grid of just those splits computes it, the one-split rows
    # written by their split bit for bit, the merged ones by the counters or the reduce kernel
    batch = make_batch([1, 1, 1], [100, 5, 47], 8, 2, 32, seed=9)
    ref, _ = reference(batch, SCALE, window)
    config = replace(SMALL_DECODE, split_keys=32, merge_in_launch=in_launch)
    out = _decode(batch, window, 8, config)
    _assert_close(out, ref, torch.float32)
    used = [1, 1, 1] if window > 0 else [4, 1, 2]
    for row, splits in enumerate(used):
        alone = _decode(batch, window, splits)[row]
        if splits == 1:
            assert torch.equal(out[row], alone)
        torch.testing.assert_close(out[row], alone, rtol=1e-6, atol=1e-6)
    assert not in_launch or not arrival.arrival_counters(out.device, True).any()


@pytest.mark.parametrize("num_splits,in_launch", [(1, False), (2, False), (2, True)])
def test_decode_launch_order_changes_no_output(num_splits, in_launch, monkeypatch):
    # programs launched longest context first (and every KV head of a sequence together):
    # each (sequence, KV head) still computed once, its output bit for bit the grid order's
    batch = make_batch([1] * 5, [30, 3, 70, 0, 9], 8, 2, 32, seed=11)
    monkeypatch.setattr(arrival, "ONE_LAUNCH", in_launch)
    plain = _decode(batch, -1, num_splits)
    order = torch.tensor([2, 0, 4, 1, 3], dtype=torch.int32)
    assert torch.equal(_decode(batch, -1, num_splits, order=order), plain)
    _assert_close(plain, reference(batch, SCALE, -1)[0], torch.float32)


def test_num_splits_depend_on_shapes_only():
    cpu = torch.device("cpu")
    cfg = DecodeConfig(block_n=16, max_splits=8)
    assert choose_num_splits(1, 1, 1024, cfg, cpu) == 8  # few programs: split
    assert choose_num_splits(1, 1, 32, cfg, cpu) == 2  # but never more splits than tiles
    assert choose_num_splits(64, 8, 4096, cfg, cpu) == 1  # the batch already fills the device
    floor = replace(cfg, min_splits=4)  # long contexts of a large batch split anyway
    assert choose_num_splits(64, 8, 4096, floor, cpu) == 4
    assert choose_num_splits(64, 8, 32, floor, cpu) == 2  # still no more than the tiles


def _run_op(batch, backend, window):
    ctx = ForwardContext(batch.meta, [batch.kv_cache], backend=backend)
    with set_forward_context(ctx):
        return attention(batch.q, batch.k, batch.v, 0, SCALE, window)


@pytest.mark.parametrize("window", [-1, 6])
def test_backend_through_the_op(window):
    prefill = make_batch([9, 1, 20], [4, 33, 0], 4, 2, 32, pad_rows=2, seed=5)
    ref, _ = reference(prefill, SCALE, window)
    out = _run_op(prefill, "triton", window)
    _assert_close(out, ref, torch.float32)
    assert torch.equal(out[-2:], torch.zeros_like(out[-2:]))
    decode = make_batch([1, 1, 1], [17, 80, 2], 4, 2, 32, seed=6)
    ref, _ = reference(decode, SCALE, window)
    _assert_close(_run_op(decode, "triton", window), ref, torch.float32)


@pytest.mark.parametrize("window", [-1, 6])
@pytest.mark.parametrize("gqa", [1, 2])
def test_mixed_batch_runs_its_leading_decodes_on_the_decode_kernel(window, gqa):
    # three decodes, a prompt chunk, a one-token chunk and a prompt: the first three take the
    # decode kernel, the rest (a one-token row among them) the prefill kernel
    batch = make_batch([1, 1, 1, 23, 1, 7], [30, 5, 70, 0, 12, 3], 2 * gqa, 2, 32, pad_rows=2,
                       seed=11 + gqa)
    assert batch.meta.num_leading_decodes == 3
    ref, _ = reference(batch, SCALE, window)
    out = _run_op(batch, "triton", window)
    _assert_close(out, ref, torch.float32)
    assert torch.equal(out[-2:], torch.zeros_like(out[-2:]))
    prompt_first = make_batch([9, 1, 1], [0, 40, 7], 2 * gqa, 2, 32, seed=gqa)
    assert prompt_first.meta.num_leading_decodes == 0
    ref, _ = reference(prompt_first, SCALE, window)
    _assert_close(_run_op(prompt_first, "triton", window), ref, torch.float32)


@pytest.mark.parametrize("name", ["llama", "mistral"])  # mistral: sliding window 24, head_dim 16
def test_engine_greedy_tokens_match_torch_backend(name):
    from compiled_llm import LLM, SamplingParams
    from tests.utils import make_checkpoint, random_prompts

    prompts = [{"prompt_token_ids": p} for p in random_prompts(3, 300, lo=20, hi=45, seed=1)]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    # a 32-token budget chunks the prompts and mixes chunks with decodes
    llm = LLM(str(make_checkpoint(name)), enforce_eager=True, dtype="float32",
              max_num_batched_tokens=32, skip_tokenizer_init=True)
    ref = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    llm.engine.executor.worker.runner.attn_backend = "triton"
    out = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert out == ref
    assert llm.engine.num_used_blocks == 0


def _uncached_meta(lens):
    from compiled_llm.attention.metadata import AttentionMetadata

    starts = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    return AttentionMetadata(
        slot_mapping=torch.empty(0, dtype=torch.int64), query_start_loc=starts,
        seq_lens=seq_lens, block_tables=torch.empty(len(lens), 0, dtype=torch.int32),
        num_actual_tokens=sum(lens), max_query_len=max(lens), max_seq_len=max(lens),
        query_start_loc_cpu=starts, seq_lens_cpu=seq_lens)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("gqa", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_uncached_varlen_through_the_op(causal, gqa, dtype):
    # pooling runs: no cache, each sequence over its own rows, bidirectional for encoders
    lens = [23, 1, 40, 7]
    g = torch.Generator().manual_seed(gqa)
    total, kv_heads = sum(lens), 2
    q = torch.randn(total + 3, 2 * gqa * kv_heads // 2, 32, generator=g).to(dtype)
    k = torch.randn(total + 3, kv_heads, 32, generator=g).to(dtype)
    v = torch.randn(total + 3, kv_heads, 32, generator=g).to(dtype)
    meta = _uncached_meta(lens)
    outs = {}
    for backend in ("torch", "triton"):
        with set_forward_context(ForwardContext(meta, [], backend=backend)):
            outs[backend] = attention(q, k, v, 0, SCALE, -1, causal)
    ref = outs["torch"].float()
    if causal:  # the paged reference's answer for whole prompts
        first = attention_forward_reference_rows(q, k, v, lens)
        torch.testing.assert_close(ref[:lens[0]], first, atol=tolerance(dtype), rtol=0)
    _assert_close(outs["triton"], ref, dtype, rows=total)
    assert torch.equal(outs["triton"][total:], torch.zeros_like(outs["triton"][total:]))


def attention_forward_reference_rows(q, k, v, lens):
    """The first sequence's causal attention, computed densely in float32."""
    n = lens[0]
    qh, kh, vh = (t[:n].float().transpose(0, 1) for t in (q, k, v))
    kh = kh.repeat_interleave(qh.shape[0] // kh.shape[0], 0)
    vh = vh.repeat_interleave(qh.shape[0] // vh.shape[0], 0)
    scores = (qh @ kh.transpose(1, 2)) * SCALE
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return (scores.softmax(-1) @ vh).transpose(0, 1)


@pytest.mark.parametrize("window", [3, 20])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_uncached_bidirectional_window(window, dtype):
    # encoders with local layers (ModernBERT, EmbeddingGemma): keys less than window away,
    # on both sides; both backends against a dense float32 reference per sequence
    lens = [23, 1, 70, 7]
    g = torch.Generator().manual_seed(window)
    total = sum(lens)
    q, k, v = (torch.randn(total, heads, 32, generator=g).to(dtype) for heads in (4, 2, 2))
    meta = _uncached_meta(lens)
    for backend in ("torch", "triton"):
        with set_forward_context(ForwardContext(meta, [], backend=backend)):
            out = attention(q, k, v, 0, SCALE, window, False)
        start = 0
        for n in lens:
            ref = _dense_window_rows(q[start:start + n], k[start:start + n],
                                     v[start:start + n], window)
            torch.testing.assert_close(out[start:start + n].float(), ref,
                                       atol=tolerance(dtype), rtol=0)
            start += n


def _dense_window_rows(q, k, v, window):
    """One sequence's bidirectional attention over keys less than window away, in float32."""
    n = q.shape[0]
    qh, kh, vh = (t.float().transpose(0, 1) for t in (q, k, v))
    kh = kh.repeat_interleave(qh.shape[0] // kh.shape[0], 0)
    vh = vh.repeat_interleave(qh.shape[0] // vh.shape[0], 0)
    pos = torch.arange(n)
    far = (pos[:, None] - pos[None, :]).abs() >= window
    scores = ((qh @ kh.transpose(1, 2)) * SCALE).masked_fill(far, float("-inf"))
    return (scores.softmax(-1) @ vh).transpose(0, 1)


def test_launch_order_only_where_the_batch_fills_the_device():
    from compiled_llm.attention.kernels.decode import ORDER_MAX_SPLITS, SplitPlan

    order, q = torch.arange(4, dtype=torch.int32), torch.zeros(1, 1, 16)
    few = SplitPlan(ORDER_MAX_SPLITS, False, None, q, q)
    many = SplitPlan(ORDER_MAX_SPLITS + 1, False, None, q, q)
    assert few.launch_args(q, order)["ORDER"] and not few.launch_args(q, None)["ORDER"]
    assert not many.launch_args(q, order)["ORDER"]


@pytest.mark.parametrize("window", [-1, 6])
@pytest.mark.parametrize("softcap,sinks,slopes,seed", [
    (2.0, None, None, 20),  # Gemma 2's attn_logit_softcapping
    (0.0, torch.tensor([0.5, -1.0, 3.0, 8.0]), None, 30),  # GPT-OSS's per-head sink logits
    (0.0, None, torch.tensor([0.5, 0.25, 0.125, 0.0625]), 40),  # ALiBi's slopes (Bloom)
])
def test_score_options_match_the_reference(window, softcap, sinks, slopes, seed):
    # through the op: all-decode (split decode kernel; with sinks one split starts from them),
    # mixed (decodes on the decode kernel, the rest on the prefill kernel), uncached (varlen)
    for offset, (q_lens, ctx_lens) in enumerate([([1, 1, 1], [17, 80, 2]),
                                                 ([1, 9, 1, 20], [30, 4, 5, 0])]):
        batch = make_batch(q_lens, ctx_lens, 4, 2, 32, pad_rows=2, seed=seed + offset)
        outs = {}
        for backend in ("torch", "triton"):
            ctx = ForwardContext(batch.meta, [torch.nan_to_num(batch.kv_cache)], backend=backend)
            with set_forward_context(ctx):
                outs[backend] = attention(batch.q, batch.k, batch.v, 0, SCALE, window, True,
                                          softcap, sinks, slopes)
        rows = batch.meta.num_actual_tokens
        _assert_close(outs["triton"], outs["torch"].float(), torch.float32, rows=rows)
    meta = _uncached_meta([23, 1, 40])
    q, k, v = torch.randn(64, 4, 32), torch.randn(64, 2, 32), torch.randn(64, 2, 32)
    for backend in ("torch", "triton"):
        with set_forward_context(ForwardContext(meta, [], backend=backend)):
            outs[backend] = attention(q, k, v, 0, SCALE, window, True, softcap, sinks, slopes)
    _assert_close(outs["triton"], outs["torch"].float(), torch.float32, rows=64)
