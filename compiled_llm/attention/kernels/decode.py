"""Split-K paged decode attention (flash-decoding) in one Triton launch.

Program (seq, KV head, split) attends that KV head's G query heads over one slice of the keys
and writes a partial (max, sum, acc; FP8 scales folded in); the last split to finish merges them
(a per-device semaphore), or one split writes the output. Shape-only grid: CUDA-graph capturable.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from compiled_llm.attention.kernels.tile import attend_tile, head_slopes, kv_scale, softmax_start
from compiled_llm.gemm import pdl
from compiled_llm.gemm.arrival import arrival_counters
from compiled_llm.gemm.pdl import dependency_sync

LOG2E = 1.4426950408889634
# longest-first launch order up to this many splits: over mixed contexts (100-2,048 keys) it
# took 7-17% off at 32-128 sequences (2 splits or 1) and added 6% at 8 (5 splits; H100,
# docs/benchmarks.md calls 93-95)
ORDER_MAX_SPLITS = 2


@dataclass(frozen=True)
class DecodeConfig:
    """Tile shape and launch parameters of the decode kernels."""

    block_n: int = 64  # keys per inner step
    num_warps: int = 4
    num_stages: int = 3
    max_splits: int = 32  # upper bound on KV splits per (sequence, KV head)
    # fewest keys a split attends: a shorter context runs fewer of the grid's splits, and one
    # split writes the output itself (no merge); 0: every split of the grid
    split_keys: int = 0
    merge_in_launch: bool = False  # the last split merges (counters), not a second kernel
    # fewest splits of the grid whatever the batch (with split_keys: the most a long context
    # takes where the batch alone would give one split); 1: the batch decides
    min_splits: int = 1


def merge_counters(device: torch.device, config: DecodeConfig) -> torch.Tensor | None:
    """The arrival counters of the in-launch merge (None: a second kernel merges); see
    compiled_llm/gemm/arrival.py."""
    return arrival_counters(device, True if config.merge_in_launch else None)


@triton.jit
def _merge_head(part_acc_ptr, part_ml_ptr, out_ptr, b, h, num_heads, num_splits, used,
                stride_ot, stride_oh, S_PAD: tl.constexpr, D: tl.constexpr, CACHE: tl.constexpr):
    """Query head h's output from its first `used` of num_splits partials (CACHE: the loads'
    cache modifier)."""
    offs_s = tl.arange(0, S_PAD)
    offs_d = tl.arange(0, D)
    s_ok = offs_s < used
    row = (b.to(tl.int64) * num_heads + h) * num_splits + offs_s  # [S_PAD]
    m = tl.load(part_ml_ptr + row * 2, mask=s_ok, other=-1.0e30, cache_modifier=CACHE)
    lsum = tl.load(part_ml_ptr + row * 2 + 1, mask=s_ok, other=0.0, cache_modifier=CACHE)
    acc = tl.load(part_acc_ptr + row[:, None] * D + offs_d[None, :], mask=s_ok[:, None],
                  other=0.0, cache_modifier=CACHE)
    w = tl.exp2(m - tl.max(m, 0))  # empty splits carry m = -1e30 and l = 0: weight 0 or l = 0
    total = tl.sum(w * lsum, 0)
    o = tl.sum(w[:, None] * acc, 0) / tl.where(total > 0, total, 1.0)
    o_offs = b.to(tl.int64) * stride_ot + h * stride_oh + offs_d
    tl.store(out_ptr + o_offs, o.to(out_ptr.dtype.element_ty))


@triton.jit
def _last_split_merges(counter_ptr, part_acc_ptr, part_ml_ptr, out_ptr, b, kvh, num_splits,
                       used, stride_ot, stride_oh, G: tl.constexpr, S_PAD: tl.constexpr,
                       D: tl.constexpr):
    """After this program's partials: count its arrival; the last of (b, kvh)'s `used` splits
    merges its G query heads and zeroes the counter for the next launch (or graph replay).

    A CTA barrier (every thread's stores issued), then one thread's gpu-scope acq_rel add: its
    release publishes the program's partials, the last arrival's acquire sees every split's. A
    scalar atomic's result reaches all threads through shared memory: the branch is uniform."""
    tl.debug_barrier()
    slot = counter_ptr + (b * tl.num_programs(1) + kvh)
    arrived = tl.atomic_add(slot, 1, sem="acq_rel", scope="gpu")
    if arrived == used - 1:
        num_heads = tl.num_programs(1) * G
        for g in range(G):  # .cg: read at L2, never a stale L1 line
            _merge_head(part_acc_ptr, part_ml_ptr, out_ptr, b, kvh * G + g, num_heads,
                        num_splits, used, stride_ot, stride_oh, S_PAD, D, ".cg")
        tl.store(slot, 0)


@triton.jit
def used_splits(seq_len, num_splits, window, HAS_WINDOW: tl.constexpr,
                SPLIT_KEYS: tl.constexpr):
    """(first key, splits used): all num_splits, or (SPLIT_KEYS > 0) one per SPLIT_KEYS keys of
    the attended span, at least one."""
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(seq_len - window, 0)
    used = num_splits
    if SPLIT_KEYS > 0:
        used = tl.minimum(tl.maximum(tl.cdiv(seq_len - lo, SPLIT_KEYS), 1), num_splits)
    return lo, used


@triton.jit
def split_span(seq_len, split, num_splits, window, BLOCK_N: tl.constexpr,
               HAS_WINDOW: tl.constexpr, SPLIT_KEYS: tl.constexpr):
    """(start, end, used) of the keys split `split` attends (empty past the context or at
    split >= used) and the splits used."""
    lo, used = used_splits(seq_len, num_splits, window, HAS_WINDOW, SPLIT_KEYS)
    per_split = tl.cdiv(tl.cdiv(seq_len - lo, used), BLOCK_N) * BLOCK_N
    start = lo + split * per_split
    return start, tl.minimum(start + per_split, seq_len), used


@triton.jit
def program_seq(order_ptr, ORDER: tl.constexpr):
    """This program's (sequence, KV head): its grid position, or (ORDER) the programs counted
    in launch order, every KV head of the order_ptr[0]-th sequence first, then the next: with
    the sequences longest first, the longest contexts start first and the shortest end the
    launch (the block scheduler takes programs in this order)."""
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    if ORDER:
        launched = b + kvh * tl.num_programs(0)
        kvh = launched % tl.num_programs(1)
        b = tl.load(order_ptr + launched // tl.num_programs(1))
    return b, kvh


@triton.jit
def program_split(seq_lens_ptr, order_ptr, num_splits, window, BLOCK_N: tl.constexpr,
                  HAS_WINDOW: tl.constexpr, SPLIT_KEYS: tl.constexpr, ORDER: tl.constexpr):
    """This program's (sequence, KV head, split, seq_len, key start, key end, splits used)."""
    b, kvh = program_seq(order_ptr, ORDER)
    seq_len = tl.load(seq_lens_ptr + b)
    split = tl.program_id(2)
    start, end, used = split_span(seq_len, split, num_splits, window, BLOCK_N, HAS_WINDOW,
                                  SPLIT_KEYS)
    return b, kvh, split, seq_len, start, end, used


@triton.jit
def attend_keys(
    q, b, kvh, seq_len, start, end, k_cache_ptr, v_cache_ptr, table_ptr, scales_ptr, qk_scale,
    window, stride_cb, stride_cs, stride_ch, stride_tb, sinks_ptr, slopes_ptr, split,
    G: tl.constexpr, G_PAD: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
    BS: tl.constexpr, PREC: tl.constexpr, FP8: tl.constexpr, SOFTCAP: tl.constexpr = 0.0,
    SINKS: tl.constexpr = False, ALIBI: tl.constexpr = False,
):
    """(acc [G_PAD, D], l, m): online softmax of q [G_PAD, D] (the query of position
    seq_len - 1) over cached keys [start, end) of KV head kvh; FP8 scales folded in. SINKS:
    split 0 starts from the heads' sink logits (softmax_start); ALIBI: the heads' slopes."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    table_row = table_ptr + b.to(tl.int64) * stride_tb
    k_base = k_cache_ptr + kvh * stride_ch
    v_base = v_cache_ptr + kvh * stride_ch
    offs_g = tl.arange(0, G_PAD)
    # split 0's real rows start from the sinks (compared as a vector: the interpreter takes no
    # scalar-and-vector bool as a load mask)
    first = (offs_g < G) & (offs_g * 0 + split == 0)
    m_i, l_i = softmax_start(sinks_ptr, kvh * G + offs_g, first, G_PAD, SINKS)
    slopes = head_slopes(slopes_ptr, kvh * G + offs_g, offs_g < G, G_PAD, ALIBI)
    acc = tl.zeros([G_PAD, D], tl.float32)
    q_pos = tl.full([G_PAD], 0, tl.int32) + seq_len - 1  # window: already in `start`
    qk_scale = qk_scale * kv_scale(scales_ptr, kvh, FP8)  # FP8: K's scale joins the scores
    for n0 in range(start, end, BLOCK_N):
        acc, l_i, m_i = attend_tile(acc, l_i, m_i, q, q_pos, k_base, v_base, table_row, n0, end,
                                    window, qk_scale, slopes, stride_cb, stride_cs, offs_n,
                                    offs_d, BS, True, False, PREC, FP8=FP8, SOFTCAP=SOFTCAP,
                                    ALIBI=ALIBI)
    acc = acc * kv_scale(scales_ptr, tl.num_programs(1) + kvh, FP8)  # and V's the output
    return acc, l_i, m_i


@triton.jit
def _store_out(acc, l_i, out_ptr, b, head, g_ok, stride_ot, stride_oh, D: tl.constexpr):
    """Heads `head` [G_PAD] (g_ok: real) of sequence b: acc / l (an empty sequence: zeros)."""
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_offs = b.to(tl.int64) * stride_ot + head[:, None] * stride_oh + tl.arange(0, D)[None, :]
    tl.store(out_ptr + o_offs, o.to(out_ptr.dtype.element_ty), mask=g_ok[:, None])


@triton.jit
def store_split(
    acc, l_i, m_i, b, kvh, split, used, out_ptr, part_acc_ptr, part_ml_ptr, counter_ptr,
    num_splits, stride_ot, stride_oh, G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr,
    DIRECT: tl.constexpr, MERGE: tl.constexpr, S_PAD: tl.constexpr,
):
    """Query heads kvh * G.. (rows past G unused) of a split < used: the output (DIRECT, or
    the one split used), or this split's partials (MERGE: and the last split's merge)."""
    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, D)
    head = kvh * G + offs_g  # [G_PAD]
    g_ok = offs_g < G
    if DIRECT or used == 1:
        _store_out(acc, l_i, out_ptr, b, head, g_ok, stride_ot, stride_oh, D)
    else:
        # partials laid out [B, Hq, num_splits, D] and [B, Hq, num_splits, 2]
        row = (b.to(tl.int64) * (tl.num_programs(1) * G) + head) * num_splits + split
        tl.store(part_acc_ptr + row[:, None] * D + offs_d[None, :], acc, mask=g_ok[:, None])
        tl.store(part_ml_ptr + row * 2, m_i, mask=g_ok)
        tl.store(part_ml_ptr + row * 2 + 1, l_i, mask=g_ok)
        if MERGE:
            _last_split_merges(counter_ptr, part_acc_ptr, part_ml_ptr, out_ptr, b, kvh,
                               num_splits, used, stride_ot, stride_oh, G, S_PAD, D)


@triton.jit
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, table_ptr, seq_lens_ptr, order_ptr, out_ptr, part_acc_ptr,
    part_ml_ptr, scales_ptr, counter_ptr, sinks_ptr, slopes_ptr, qk_scale, window, num_splits,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_cb, stride_cs, stride_ch, stride_tb,
    G: tl.constexpr, G_PAD: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
    BS: tl.constexpr, HAS_WINDOW: tl.constexpr, DIRECT: tl.constexpr, PREC: tl.constexpr,
    FP8: tl.constexpr = False, MERGE: tl.constexpr = False, S_PAD: tl.constexpr = 1,
    SPLIT_KEYS: tl.constexpr = 0, PDL: tl.constexpr = 0, ORDER: tl.constexpr = False,
    SOFTCAP: tl.constexpr = 0.0, SINKS: tl.constexpr = False, ALIBI: tl.constexpr = False,
):
    """DIRECT (or one split used): that split writes the output. Otherwise partials; MERGE: the
    last of a (seq, KV head)'s used splits to arrive merges them (counter_ptr: zeroed int32
    [>= B * Hkv]). Splits past those used do nothing. ORDER: see program_seq."""
    dependency_sync(PDL)
    b, kvh, split, seq_len, start, end, used = program_split(
        seq_lens_ptr, order_ptr, num_splits, window, BLOCK_N, HAS_WINDOW, SPLIT_KEYS, ORDER)
    if split < used:
        offs_g = tl.arange(0, G_PAD)
        head = kvh * G + offs_g  # [G_PAD]
        q_offs = (b.to(tl.int64) * stride_qt + head[:, None] * stride_qh
                  + tl.arange(0, D)[None, :])
        q = tl.load(q_ptr + q_offs, mask=(offs_g < G)[:, None], other=0.0)  # [G_PAD, D]
        acc, l_i, m_i = attend_keys(q, b, kvh, seq_len, start, end, k_cache_ptr, v_cache_ptr,
                                    table_ptr, scales_ptr, qk_scale, window, stride_cb,
                                    stride_cs, stride_ch, stride_tb, sinks_ptr, slopes_ptr,
                                    split, G, G_PAD, BLOCK_N, D, BS, PREC, FP8, SOFTCAP, SINKS,
                                    ALIBI)
        store_split(acc, l_i, m_i, b, kvh, split, used, out_ptr, part_acc_ptr, part_ml_ptr,
                    counter_ptr, num_splits, stride_ot, stride_oh, G, G_PAD, D, DIRECT, MERGE,
                    S_PAD)


@triton.jit
def _decode_reduce_kernel(
    part_acc_ptr, part_ml_ptr, out_ptr, seq_lens_ptr, window, num_splits, stride_ot,
    stride_oh, S_PAD: tl.constexpr, D: tl.constexpr, HAS_WINDOW: tl.constexpr,
    SPLIT_KEYS: tl.constexpr, PDL: tl.constexpr = 0,
):
    """The merge as a second kernel, program (seq, query head): launches too wide for the
    counters (or the first one inside a CUDA-graph capture). A sequence whose one used split
    wrote its output is left as it is."""
    dependency_sync(PDL)
    b = tl.program_id(0)
    _, used = used_splits(tl.load(seq_lens_ptr + b), num_splits, window, HAS_WINDOW,
                          SPLIT_KEYS)
    if used > 1:
        _merge_head(part_acc_ptr, part_ml_ptr, out_ptr, b, tl.program_id(1),
                    tl.num_programs(1), num_splits, used, stride_ot, stride_oh, S_PAD, D, "")


@functools.cache
def sm_count(device: torch.device) -> int:
    """The device's SM count (4 under the interpreter: a few splits still exercise merges)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_tokens: int, config: DecodeConfig,
                      device: torch.device) -> int:
    """Splits so that about two programs per SM run, from shapes only (CUDA-graph stable)."""
    want = triton.cdiv(2 * sm_count(device), max(1, num_seqs * num_kv_heads))
    want = max(want, config.min_splits)
    return max(1, min(want, config.max_splits, triton.cdiv(max_tokens, config.block_n)))


@dataclass
class SplitPlan:
    """One split decode launch: its splits, whether one split writes the output (direct), the
    merge's counters (None: the reduce kernel merges) and the partials' buffers."""

    num_splits: int
    direct: bool
    counters: torch.Tensor | None
    part_acc: torch.Tensor
    part_ml: torch.Tensor
    split_keys: int = 0  # DecodeConfig.split_keys: how many of the splits a context uses

    def launch_args(self, q: torch.Tensor, order: torch.Tensor | None) -> dict:
        """The split kernels' shared constexprs and launch parameters; the order (program_seq)
        where the batch alone fills the device (at most ORDER_MAX_SPLITS splits)."""
        return dict(S_PAD=triton.next_power_of_2(self.num_splits), DIRECT=self.direct,
                    MERGE=self.counters is not None, SPLIT_KEYS=self.split_keys,
                    ORDER=order is not None and self.num_splits <= ORDER_MAX_SPLITS,
                    PREC="ieee" if q.dtype == torch.float32 else "tf32",
                    **pdl.launch_kwargs(q.device))


def plan_splits(q: torch.Tensor, kv_cache: torch.Tensor, seq_lens: torch.Tensor,
                block_tables: torch.Tensor, out: torch.Tensor, config: DecodeConfig,
                num_splits: int | None) -> SplitPlan:
    """Splits from shapes only (CUDA-graph stable), and the partials they need."""
    num_seqs, num_q_heads, head_dim = seq_lens.shape[0], q.shape[1], q.shape[2]
    _, _, block_size, num_kv_heads, _ = kv_cache.shape
    if q.shape[0] < num_seqs:
        raise ValueError(f"decode needs a query row per sequence: {q.shape[0]} < {num_seqs}")
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads,
                                       block_tables.shape[1] * block_size, config, q.device)
    if num_splits == 1:
        return SplitPlan(1, True, None, out, out)  # partials unused
    counters = merge_counters(q.device, config)
    if counters is not None and num_seqs * num_kv_heads > counters.numel():
        counters = None  # too wide for the counters: merge in a second kernel
    partial_shape = (num_seqs, num_q_heads, num_splits)
    part_acc = torch.empty(*partial_shape, head_dim, dtype=torch.float32, device=q.device)
    part_ml = torch.empty(*partial_shape, 2, dtype=torch.float32, device=q.device)
    return SplitPlan(num_splits, False, counters, part_acc, part_ml, config.split_keys)


def merge_splits(plan: SplitPlan, out: torch.Tensor, seq_lens: torch.Tensor,
                 sliding_window: int) -> None:
    """The reduce kernel, where the plan's splits are not merged inside the launch."""
    if plan.direct or plan.counters is not None:
        return
    _decode_reduce_kernel[(seq_lens.shape[0], out.shape[1])](
        plan.part_acc, plan.part_ml, out, seq_lens, sliding_window, plan.num_splits,
        out.stride(0), out.stride(1), S_PAD=triton.next_power_of_2(plan.num_splits),
        D=out.shape[2], HAS_WINDOW=sliding_window > 0, SPLIT_KEYS=plan.split_keys,
        num_warps=4, **pdl.launch_kwargs(out.device),
    )


def group_pad(num_q_heads: int, num_kv_heads: int) -> tuple[int, int]:
    """(query heads per KV head, padded to the MMA's 16 rows)."""
    group_size = num_q_heads // num_kv_heads
    return group_size, max(16, triton.next_power_of_2(group_size))


def decode_attention(
    q: torch.Tensor,  # [T >= B, Hq, D]; row b is sequence b's one query
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, Hkv, D]
    seq_lens: torch.Tensor,  # [B] int32, 0 for padding
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    scale: float,
    sliding_window: int,
    out: torch.Tensor,  # [T, Hq, D]; rows >= B are left as they are
    config: DecodeConfig,
    num_splits: int | None = None,
    kv_scales: torch.Tensor | None = None,  # [2, Hkv] float32: the cache is FP8
    order: torch.Tensor | None = None,  # [B] int32: the sequences, longest context first
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,  # [Hq]: each head's sink logit (GPT-OSS)
    alibi_slopes: torch.Tensor | None = None,  # [Hq] float32: ALiBi's slopes (Bloom, MPT)
) -> torch.Tensor:
    """One query per sequence over its paged context; no host sync, graph-capturable. order
    (a permutation of range(B)) only orders the programs' launch (program_seq); softcap > 0:
    scores soft-capped; sinks: a logit per head in every softmax, as a key of value 0;
    alibi_slopes: ALiBi."""
    plan = plan_splits(q, kv_cache, seq_lens, block_tables, out, config, num_splits)
    num_seqs, head_dim, num_kv_heads = seq_lens.shape[0], q.shape[2], kv_cache.shape[3]
    group_size, padded = group_pad(q.shape[1], num_kv_heads)
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    _decode_split_kernel[(num_seqs, num_kv_heads, plan.num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, seq_lens if order is None else order, out,
        plan.part_acc, plan.part_ml, seq_lens if kv_scales is None else kv_scales,
        seq_lens if plan.counters is None else plan.counters, q if sinks is None else sinks,
        q if alibi_slopes is None else alibi_slopes, scale * LOG2E, sliding_window,
        plan.num_splits, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        G=group_size, G_PAD=padded, BLOCK_N=config.block_n, D=head_dim, BS=kv_cache.shape[2],
        HAS_WINDOW=sliding_window > 0, FP8=kv_scales is not None, SOFTCAP=softcap * LOG2E,
        SINKS=sinks is not None, ALIBI=alibi_slopes is not None, num_warps=config.num_warps,
        num_stages=config.num_stages, **plan.launch_args(q, order),
    )
    merge_splits(plan, out, seq_lens, sliding_window)
    return out
