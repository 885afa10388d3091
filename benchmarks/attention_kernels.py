"""Micro-benchmark of the Triton attention kernels against torch SDPA and the reference backend,
at Llama-3-8B attention shapes (32 q heads, 8 KV heads, head_dim 128, bf16, block_size 16).

    python -m benchmarks.attention_kernels [--json out.json] [--sweep | --split-sweep]

Decode at batch 1/32/256 x context 1k/8k/32k (achieved KV bandwidth, % of the copy bandwidth
measured in the same run), prefill at 1k/4k/16k (TFLOP/s), and the cache write. Ratios are
peer time / ours (> 1: ours faster). Timings replay CUDA graphs where the path allows it. Cases
whose KV cache fits in L2 (50 MB) read it from L2 on replays and overstate bandwidth.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

import torch
import torch.nn.functional as F

from benchmarks.common import print_table, save_json
from benchmarks.hardware import copy_bandwidth_gbs
from compiled_llm.attention.kernels import (
    DecodeConfig,
    PrefillConfig,
    decode_attention,
    prefill_attention,
    write_kv_cache,
)
from compiled_llm.attention.metadata import AttentionMetadata
from compiled_llm.attention.reference import attention_forward
from compiled_llm.attention.triton_backend import decode_config, prefill_config, triton_attention

HQ, HKV, D, BS = 32, 8, 128, 16
SCALE = D**-0.5
DTYPE = torch.bfloat16
REFERENCE_MAX_CACHE_BYTES = 8 << 30  # the reference gathers the cache: skip it above this


def bench_ms(fn, iters: int = 20, graph: bool = True) -> float:
    """Mean ms per call: replays of a CUDA graph holding `iters` calls, else eager with events."""
    fn()
    torch.cuda.synchronize()
    if graph:
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(iters):
                    fn()
            g.replay()
            return _time(g.replay, reps=3) / iters
        except RuntimeError:
            torch.cuda.synchronize()
    return _time(lambda: [fn() for _ in range(iters)], reps=3) / iters


def _time(fn, reps: int) -> float:
    best = math.inf
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end))
    return best


def paged_case(batch: int, ctx: int, q_len: int, seed: int = 0):
    """Paged cache holding `ctx` cached tokens per sequence, `q_len` new ones, random blocks."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    seq = ctx + q_len
    per_seq = -(-seq // BS)
    num_blocks = batch * per_seq + 1
    cache = torch.randn(2, num_blocks, BS, HKV, D, device="cuda", dtype=DTYPE, generator=gen)
    table = (torch.randperm(num_blocks - 1, device="cuda", generator=gen) + 1).int()
    table = table.view(batch, per_seq)
    pos = torch.arange(ctx, seq, device="cuda")
    slots = (table[:, pos // BS].long() * BS + pos % BS).flatten()
    qsl = torch.arange(batch + 1, dtype=torch.int32) * q_len
    lens = torch.full((batch,), seq, dtype=torch.int32)
    meta = AttentionMetadata(slots, qsl.cuda(), lens.cuda(), table, batch * q_len, q_len, seq,
                             qsl, lens)
    t = batch * q_len
    q = torch.randn(t, HQ, D, device="cuda", dtype=DTYPE, generator=gen)
    k, v = (torch.randn(t, HKV, D, device="cuda", dtype=DTYPE, generator=gen) for _ in "kv")
    return q, k, v, cache, meta


def contiguous_kv(cache, meta) -> tuple[torch.Tensor, torch.Tensor]:
    """The paged cache gathered into [B, Hkv, L, D] K and V, the peer's layout."""
    n, table = meta.max_seq_len, meta.block_tables.long()
    k = cache[0][table].flatten(1, 2)[:, :n].transpose(1, 2).contiguous()
    v = cache[1][table].flatten(1, 2)[:, :n].transpose(1, 2).contiguous()
    return k, v


def _sdpa_decode_ms(q, cache, meta) -> float:
    """SDPA over contiguous K/V; GQA decode as G queries per KV head, so no K/V expansion."""
    gk, gv = contiguous_kv(cache, meta)
    qg = q.view(q.shape[0], HKV, HQ // HKV, D)
    return bench_ms(lambda: F.scaled_dot_product_attention(qg, gk, gv, scale=SCALE))


def _sdpa_prefill_ms(q, cache, meta, length: int, ctx: int) -> float:
    """SDPA (flash for causal) over contiguous K/V expanded to the query heads."""
    gk, gv = contiguous_kv(cache, meta)
    ks, vs = (x.repeat_interleave(HQ // HKV, dim=1) for x in (gk, gv))
    del gk, gv
    qs = q.transpose(0, 1)[None]
    mask = None
    if ctx:  # chunk after cached context: bottom-right aligned causal mask
        mask = torch.ones(length, ctx + length, dtype=torch.bool, device="cuda").tril(ctx)
    return bench_ms(lambda: F.scaled_dot_product_attention(
        qs, ks, vs, attn_mask=mask, is_causal=mask is None, scale=SCALE), iters=5)


def peer_ms(fn, *args, **kwargs) -> float:
    """A peer's time, or NaN when it runs out of device memory (it may copy the cache)."""
    torch.cuda.empty_cache()
    try:
        return fn(*args, **kwargs)
    except torch.cuda.OutOfMemoryError:
        print(f"{getattr(fn, '__name__', 'peer')}: out of memory, reported as nan")
        return math.nan


def decode_row(batch: int, ctx: int, bw: float) -> dict:
    torch.cuda.empty_cache()
    q, k, v, cache, meta = paged_case(batch, ctx, 1)
    ours = bench_ms(lambda: triton_attention(q, k, v, cache, meta, SCALE, -1))
    kv_bytes = 2 * batch * (ctx + 1) * HKV * D * cache.element_size()
    sdpa = peer_ms(_sdpa_decode_ms, q, cache, meta)
    ref = math.nan
    if cache.numel() * cache.element_size() <= REFERENCE_MAX_CACHE_BYTES:
        ref = peer_ms(bench_ms, lambda: attention_forward(q, k, v, cache, meta, SCALE, -1),
                      iters=5, graph=False)
    gbs = kv_bytes / ours / 1e6
    return {"batch": batch, "context": ctx, "ours_us": ours * 1e3, "GB/s": gbs,
            "%copy_bw": 100 * gbs / bw, "sdpa_us": sdpa * 1e3, "vs_sdpa": sdpa / ours,
            "reference_us": ref * 1e3, "vs_reference": ref / ours}


def prefill_row(length: int, ctx: int = 0) -> dict:
    torch.cuda.empty_cache()
    q, k, v, cache, meta = paged_case(1, ctx, length)
    ours = bench_ms(lambda: triton_attention(q, k, v, cache, meta, SCALE, -1), iters=5)
    flops = 4 * HQ * D * (length * ctx + length * (length + 1) / 2)
    sdpa = peer_ms(_sdpa_prefill_ms, q, cache, meta, length, ctx)
    ref = peer_ms(bench_ms, lambda: attention_forward(q, k, v, cache, meta, SCALE, -1),
                  iters=3, graph=False)
    return {"length": length, "context": ctx, "ours_ms": ours, "TFLOP/s": flops / ours / 1e9,
            "sdpa_ms": sdpa, "sdpa_TFLOP/s": flops / sdpa / 1e9, "vs_sdpa": sdpa / ours,
            "reference_ms": ref, "vs_reference": ref / ours}


def cache_write_row(tokens: int, bw: float) -> dict:
    q, k, v, cache, meta = paged_case(1, 0, tokens)
    ours = bench_ms(lambda: write_kv_cache(k, v, cache, meta.slot_mapping))
    slots = meta.slot_mapping
    ref = bench_ms(lambda: (cache[0].view(-1, HKV, D).index_copy_(0, slots, k),
                            cache[1].view(-1, HKV, D).index_copy_(0, slots, v)))
    moved = 2 * 2 * k.numel() * k.element_size()  # read + write, K and V
    gbs = moved / ours / 1e6
    return {"tokens": tokens, "ours_us": ours * 1e3, "GB/s": gbs, "%copy_bw": 100 * gbs / bw,
            "index_copy_us": ref * 1e3, "vs_index_copy": ref / ours}


def _sweep_decode(batch: int, ctx: int, fp8: bool = False) -> list[dict]:
    """Decode tile configs; fp8: over an FP8 (e4m3) cache with per-head scales."""
    q, _, _, cache, meta = paged_case(batch, ctx, 1)
    scales = None
    if fp8:
        scales = torch.ones(2, HKV, device="cuda")
        cache = cache.to(torch.float8_e4m3fn)
    out, rows = torch.empty_like(q), []
    for bn in (32, 64, 128):
        for warps, stages in ((4, 2), (4, 3), (8, 3), (4, 4)):
            cfg = DecodeConfig(block_n=bn, num_warps=warps, num_stages=stages)
            ms = bench_ms(lambda c=cfg: decode_attention(
                q, cache, meta.seq_lens, meta.block_tables, SCALE, -1, out, c,
                kv_scales=scales))
            rows.append({"case": f"decode b{batch} ctx{ctx}" + (" fp8" if fp8 else ""),
                         "config": str(cfg), "us": ms * 1e3})
    return rows


# (split_keys, merge in launch): the fixed grid (the default) first, then the opt-ins
SPLIT_VARIANTS = ((0, False), (256, True), (512, True), (256, False), (128, True))


def _split_rows(batch: int, ctx: int, graph_tokens: int) -> list[dict]:
    """Decode launches with the grid the engine captures (a block table as wide as
    graph_tokens) in each of SPLIT_VARIANTS."""
    q, _, _, cache, meta = paged_case(batch, ctx, 1)
    table = torch.zeros(batch, graph_tokens // BS, dtype=torch.int32, device="cuda")
    table[:, :meta.block_tables.shape[1]] = meta.block_tables
    out, rows = torch.empty_like(q), []
    for keys, in_launch in SPLIT_VARIANTS:
        cfg = replace(decode_config(D), split_keys=keys, merge_in_launch=in_launch)
        ms = bench_ms(lambda c=cfg: decode_attention(q, cache, meta.seq_lens, table, SCALE, -1,
                                                     out, c))
        rows.append({"batch": batch, "context": ctx, "split_keys": keys,
                     "merge": "in launch" if in_launch else "kernel", "us": ms * 1e3})
    return rows


def split_sweep(graph_tokens: int = 40960) -> list[dict]:
    """Decode time by SPLIT_VARIANTS, at the grid of a graph captured for graph_tokens."""
    return [row for batch in (1, 8, 32) for ctx in (128, 384, 1024, 4096, 16384)
            for row in _split_rows(batch, ctx, graph_tokens)]


def fp8_sweep() -> list[dict]:
    """Decode tile configs over bf16 and FP8 caches at the FP8 benchmark's shapes."""
    return [row for batch, ctx in ((64, 1152), (256, 1152), (1, 8192)) for fp8 in (False, True)
            for row in _sweep_decode(batch, ctx, fp8)]


# (split_keys, splits): the default (splits from the batch) first, then long contexts split
MIXED_VARIANTS = ((0, None), (512, 4), (1024, 2))


def mixed_case(batch: int, lo: int, hi: int, seed: int = 0):
    """A decode batch of contexts uniform in [lo, hi] (the nano-vllm workload's spread), the
    one-launch kernel's raw q/k/v and rotary rows; the newest key goes to each one's slot."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    lens = torch.randint(lo, hi + 1, (batch,), device="cuda", generator=gen, dtype=torch.int32)
    per_seq = -(-hi // BS)
    num_blocks = batch * per_seq + 1
    cache = torch.randn(2, num_blocks, BS, HKV, D, device="cuda", dtype=DTYPE, generator=gen)
    table = (torch.randperm(num_blocks - 1, device="cuda", generator=gen) + 1).int()
    table = table.view(batch, per_seq)
    newest = (lens - 1).long()
    slots = table.gather(1, (newest // BS)[:, None]).flatten().long() * BS + newest % BS
    q = torch.randn(batch, HQ, D, device="cuda", dtype=DTYPE, generator=gen)
    k, v = (torch.randn(batch, HKV, D, device="cuda", dtype=DTYPE, generator=gen) for _ in "kv")
    cos, sin = (torch.rand(batch, 1, D, device="cuda", dtype=DTYPE, generator=gen) for _ in "cs")
    return q, k, v, cos, sin, cache, lens, table, slots


def _mixed_rows(batch: int, lo: int, hi: int) -> list[dict]:
    from compiled_llm.attention.kernels.decode_qk import decode_qk_norm_rope_attention

    q, k, v, cos, sin, cache, lens, table, slots = mixed_case(batch, lo, hi)
    kv_bytes = 2 * int(lens.sum()) * HKV * D * cache.element_size()
    longest_first = torch.argsort(lens, descending=True, stable=True).to(torch.int32)
    out, rows = torch.empty_like(q), []
    variants = [(keys, splits, block_n, None) for keys, splits in MIXED_VARIANTS
                for block_n in (64, 128)]
    variants += [(0, None, 128, longest_first), (1024, 2, 128, longest_first)]
    for keys, splits, block_n, order in variants:
        cfg = replace(decode_config(D), split_keys=keys, block_n=block_n, num_stages=3)
        ms = bench_ms(lambda c=cfg, n=splits, o=order: decode_qk_norm_rope_attention(
            q, k, v, cos, sin, None, None, 1e-6, cache, lens, table, slots, SCALE, -1, out, c,
            n, o))
        rows.append({"batch": batch, "contexts": f"{lo}-{hi}", "split_keys": keys,
                     "splits": splits or "batch", "block_n": block_n,
                     "order": "batch" if order is None else "longest first",
                     "us": ms * 1e3, "GB/s": kv_bytes / ms / 1e6})
    return rows


def mixed_sweep() -> list[dict]:
    """The one-launch decode over mixed contexts at serving batch sizes, by split variant and
    launch order."""
    return [row for batch in (8, 32, 64, 128, 256) for row in _mixed_rows(batch, 100, 2048)]


def _sweep_prefill(length: int) -> list[dict]:
    q, _, _, cache, meta = paged_case(1, 0, length)
    out, rows = torch.empty_like(q), []
    for bm, bn, warps, stages in ((128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 3),
                                  (64, 64, 4, 3), (128, 32, 8, 4), (64, 128, 8, 2)):
        cfg = PrefillConfig(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages)
        try:
            ms = bench_ms(lambda c=cfg: prefill_attention(
                q, cache, meta.query_start_loc, meta.seq_lens, meta.block_tables, length,
                SCALE, -1, out, c), iters=5)
        except Exception as e:  # e.g. out of shared memory for a config: report, keep going
            ms = math.nan
            print(f"prefill {cfg}: {type(e).__name__}: {e}")
        rows.append({"case": f"prefill {length}", "config": str(cfg), "us": ms * 1e3})
    return rows


def sweep() -> list[dict]:
    """Time alternative tile configs; the defaults live in triton_backend."""
    rows = []
    for batch, ctx in ((1, 32768), (32, 8192), (256, 8192)):
        rows += _sweep_decode(batch, ctx)
    return rows + _sweep_prefill(16384)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--sweep", action="store_true", help="also time alternative tile configs")
    ap.add_argument("--split-sweep", action="store_true",
                    help="only time decode's split variants (graph grid of 40,960 tokens)")
    ap.add_argument("--fp8-sweep", action="store_true",
                    help="only time decode tile configs over bf16 and FP8 caches")
    ap.add_argument("--mixed-sweep", action="store_true",
                    help="only time the one-launch decode over mixed contexts, by split variant")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("attention_kernels.py needs a CUDA device")
    torch.manual_seed(0)
    if args.split_sweep:
        rows = split_sweep()
        print_table(rows, "Decode by split variant, per layer")
        return save_json(args.json, {"device": torch.cuda.get_device_name(), "splits": rows})
    if args.mixed_sweep:
        rows = mixed_sweep()
        print_table(rows, "One-launch decode over contexts of 100-2048 tokens, per layer")
        return save_json(args.json, {"device": torch.cuda.get_device_name(), "mixed": rows})
    if args.fp8_sweep:
        rows = fp8_sweep()
        print_table(rows, "Decode tile configs, bf16 and FP8 caches")
        return save_json(args.json, {"device": torch.cuda.get_device_name(), "sweep": rows})
    bw = copy_bandwidth_gbs()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bw:,.0f} GB/s; "
          f"defaults decode {decode_config(D)}, prefill {prefill_config(D)}")
    decode = [decode_row(b, c, bw) for b in (1, 32, 256) for c in (1024, 8192, 32768)]
    print_table(decode, "Decode (split-K), per layer, bf16, 32/8 heads, head_dim 128")
    prefill = [prefill_row(n) for n in (1024, 4096, 16384)] + [prefill_row(2048, 14336)]
    print_table(prefill, "Prefill (causal, one sequence; last row: a chunk after its context)")
    writes = [cache_write_row(n, bw) for n in (256, 16384)]
    print_table(writes, "KV cache write through the slot mapping")
    result = {"device": torch.cuda.get_device_name(), "copy_bw_gbs": bw, "decode": decode,
              "prefill": prefill, "cache_write": writes}
    if args.sweep:
        result["sweep"] = sweep()
        print_table(result["sweep"], "Tile configs")
    save_json(args.json, result)


if __name__ == "__main__":
    main()
