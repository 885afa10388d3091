"""Varlen paged attention (prefill, chunked prefill, and mixed batches) as one Triton kernel.

A program owns BLOCK_Q query tokens of one sequence x the G query heads of one KV head (each K/V
tile read once per GQA group), after its cached context; fp32 online softmax with exp2, masks on
diagonal and window-edge tiles only. `varlen_attention`: unpaged (pooling), causal or not."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from compiled_llm.attention.kernels.tile import attend_tile, head_slopes, kv_scale, softmax_start

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class PrefillConfig:
    """Tile shape and launch parameters of the prefill kernel."""

    block_m: int = 128  # query rows (tokens x GQA heads) per program
    block_n: int = 64  # keys per inner step
    num_warps: int = 8
    num_stages: int = 3


@triton.jit
def _key_ranges(first, last, window, BLOCK_N: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """Key tiles for queries at positions first..last: masked [lo, full_lo), whole
    [full_lo, full_hi), masked [full_hi, last + 1); all bounds but the last BLOCK_N-aligned."""
    lo = first * 0  # a tensor on both branches
    full_lo = lo
    if HAS_WINDOW:
        lo = tl.maximum(first - window + 1, 0)
        full_lo = tl.maximum(last - window + 1, 0)
    lo = (lo // BLOCK_N) * BLOCK_N
    full_lo = tl.cdiv(full_lo, BLOCK_N) * BLOCK_N  # first tile every row sees whole
    full_hi = ((first + 1) // BLOCK_N) * BLOCK_N  # end of the tiles below the diagonal
    empty = full_hi <= full_lo
    full_lo = tl.where(empty, lo, full_lo)
    full_hi = tl.where(empty, lo, full_hi)
    return lo, full_lo, full_hi


@triton.jit
def _visible_keys(first, last, seq_len, window, BLOCK_N: tl.constexpr, HAS_WINDOW: tl.constexpr,
                  CAUSAL: tl.constexpr):
    """(lo, full_lo, full_hi, hi) as _key_ranges, causal; else every key of the sequence:
    whole tiles, then the masked tail; bidirectional with a window: keys within window of
    some query of the tile, every tile masked."""
    if CAUSAL:
        lo, full_lo, full_hi = _key_ranges(first, last, window, BLOCK_N, HAS_WINDOW)
        return lo, full_lo, full_hi, last + 1
    lo = first * 0
    if HAS_WINDOW:
        lo = (tl.maximum(first - window + 1, 0) // BLOCK_N) * BLOCK_N
        return lo, lo, lo, tl.minimum(last + window, seq_len)
    return lo, lo, (seq_len // BLOCK_N) * BLOCK_N, seq_len + lo


@triton.jit(do_not_specialize=["first_seq"])  # one compiled kernel whatever a step's offset
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, qsl_ptr, seq_lens_ptr, table_ptr, scales_ptr,
    sinks_ptr, slopes_ptr, qk_scale, window, first_seq,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_cb, stride_cs, stride_ch, stride_tb,
    G: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    D: tl.constexpr, BS: tl.constexpr, HAS_WINDOW: tl.constexpr, PREC: tl.constexpr,
    PAGED: tl.constexpr = True, CAUSAL: tl.constexpr = True, FP8: tl.constexpr = False,
    SOFTCAP: tl.constexpr = 0.0, SINKS: tl.constexpr = False, ALIBI: tl.constexpr = False,
):
    # longest causal tiles first: better tail balance
    pid_q = tl.num_programs(0) - 1 - tl.program_id(0)
    b, kvh = tl.program_id(1) + first_seq, tl.program_id(2)
    q_start = tl.load(qsl_ptr + b)
    q_len = tl.load(qsl_ptr + b + 1) - q_start
    tile0 = pid_q * BLOCK_Q
    if tile0 >= q_len:
        return
    if PAGED:  # noqa: SIM108 (a constexpr branch: the unpaged kernel loads nothing)
        seq_len = tl.load(seq_lens_ptr + b)
    else:  # the sequence is this step's rows alone
        seq_len = q_len
    ctx = seq_len - q_len  # tokens cached before this chunk

    offs_m, offs_n, offs_d = tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_N), tl.arange(0, D)
    tok = tile0 + offs_m // G  # [M] query index within the chunk
    head = kvh * G + offs_m % G  # [M] query head
    row_ok = (tok < q_len) & (offs_m < BLOCK_Q * G)
    q_pos = ctx + tok
    row64 = (q_start + tok).to(tl.int64)
    q_offs = row64[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr + q_offs, mask=row_ok[:, None], other=0.0)  # [M, D]
    first = ctx + tile0  # position of the tile's first query
    last = ctx + tl.minimum(tile0 + BLOCK_Q, q_len) - 1  # and of its last
    lo, full_lo, full_hi, hi = _visible_keys(first, last, seq_len, window, BLOCK_N, HAS_WINDOW,
                                             CAUSAL)
    table_row = table_ptr + b.to(tl.int64) * stride_tb
    row0 = 0 if PAGED else q_start.to(tl.int64) * stride_cs  # unpaged: the sequence's rows
    k_base = k_cache_ptr + kvh * stride_ch + row0
    v_base = v_cache_ptr + kvh * stride_ch + row0
    m_i, l_i = softmax_start(sinks_ptr, head, row_ok, BLOCK_M, SINKS)
    slopes = head_slopes(slopes_ptr, head, row_ok, BLOCK_M, ALIBI)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    qk_scale = qk_scale * kv_scale(scales_ptr, kvh, FP8)  # FP8: K's scale joins the scores
    for n0 in range(lo, full_lo, BLOCK_N):  # window's trailing edge
        acc, l_i, m_i = attend_tile(acc, l_i, m_i, q, q_pos, k_base, v_base, table_row, n0, seq_len,
                              window, qk_scale, slopes, stride_cb, stride_cs, offs_n, offs_d,
                              BS, True, HAS_WINDOW, PREC, PAGED, CAUSAL, FP8, SOFTCAP, ALIBI)
    for n0 in range(full_lo, full_hi, BLOCK_N):  # fully visible tiles
        acc, l_i, m_i = attend_tile(acc, l_i, m_i, q, q_pos, k_base, v_base, table_row, n0, seq_len,
                              window, qk_scale, slopes, stride_cb, stride_cs, offs_n, offs_d,
                              BS, False, HAS_WINDOW, PREC, PAGED, CAUSAL, FP8, SOFTCAP, ALIBI)
    for n0 in range(full_hi, hi, BLOCK_N):  # causal diagonal
        acc, l_i, m_i = attend_tile(acc, l_i, m_i, q, q_pos, k_base, v_base, table_row, n0, seq_len,
                              window, qk_scale, slopes, stride_cb, stride_cs, offs_n, offs_d,
                              BS, True, HAS_WINDOW, PREC, PAGED, CAUSAL, FP8, SOFTCAP, ALIBI)
    acc = acc * kv_scale(scales_ptr, tl.num_programs(2) + kvh, FP8)  # and V's the output
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_offs = row64[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :]
    tl.store(out_ptr + o_offs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def _tiles(max_query_len: int, group_size: int, config: PrefillConfig) -> tuple[int, int, int]:
    """(block_m, block_q, num_warps): short chunks (mixed batches of small prefills) get
    smaller tiles, which waste fewer rows."""
    rows = triton.next_power_of_2(max_query_len * group_size)
    block_m = max(min(config.block_m, rows), triton.next_power_of_2(group_size), 16)
    num_warps = config.num_warps if block_m >= config.block_m else min(config.num_warps, 4)
    return block_m, block_m // group_size, num_warps


def prefill_attention(
    q: torch.Tensor,  # [T, Hq, D]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, Hkv, D]
    query_start_loc: torch.Tensor,  # [B+1] int32
    seq_lens: torch.Tensor,  # [B] int32
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    max_query_len: int,
    scale: float,
    sliding_window: int,
    out: torch.Tensor,  # [T, Hq, D]; rows outside query_start_loc's ranges are left as they are
    config: PrefillConfig,
    kv_scales: torch.Tensor | None = None,  # [2, Hkv] float32: the cache is FP8
    first_seq: int = 0,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,  # [Hq]: each head's sink logit (GPT-OSS)
    alibi_slopes: torch.Tensor | None = None,  # [Hq] float32: ALiBi's slopes (Bloom, MPT)
) -> torch.Tensor:
    """Causal varlen attention of the queries of sequences first_seq.. over their cached
    context (the sequences before first_seq are left to the decode kernel); softcap > 0:
    scores soft-capped; sinks: a logit per head in every softmax; alibi_slopes: ALiBi."""
    num_seqs, num_q_heads, head_dim = seq_lens.shape[0] - first_seq, q.shape[1], q.shape[2]
    _, _, block_size, num_kv_heads, _ = kv_cache.shape
    group_size = num_q_heads // num_kv_heads
    block_m, block_q, num_warps = _tiles(max_query_len, group_size, config)
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    grid = (triton.cdiv(max_query_len, block_q), num_seqs, num_kv_heads)
    _prefill_kernel[grid](
        q, k_cache, v_cache, out, query_start_loc, seq_lens, block_tables,
        seq_lens if kv_scales is None else kv_scales, q if sinks is None else sinks,
        q if alibi_slopes is None else alibi_slopes, scale * LOG2E, sliding_window, first_seq,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        G=group_size, BLOCK_Q=block_q, BLOCK_M=block_m, BLOCK_N=config.block_n, D=head_dim,
        BS=block_size,
        HAS_WINDOW=sliding_window > 0, PREC="ieee" if q.dtype == torch.float32 else "tf32",
        FP8=kv_scales is not None, SOFTCAP=softcap * LOG2E, SINKS=sinks is not None,
        ALIBI=alibi_slopes is not None, num_warps=num_warps, num_stages=config.num_stages,
    )
    return out


def varlen_attention(
    q: torch.Tensor,  # [T, Hq, D]
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,
    query_start_loc: torch.Tensor,  # [B+1] int32
    max_query_len: int,
    scale: float,
    sliding_window: int,
    causal: bool,
    out: torch.Tensor,  # [T, Hq, D]; rows outside query_start_loc's ranges are left as they are
    config: PrefillConfig,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,  # [Hq]: each head's sink logit (GPT-OSS)
    alibi_slopes: torch.Tensor | None = None,  # [Hq] float32: ALiBi's slopes (Bloom, MPT)
) -> torch.Tensor:
    """Varlen attention of each sequence's queries over its own k/v rows, no cache (causal, or
    not: every query sees the sequence's every key, or with sliding_window those less than
    it away); softcap > 0: scores soft-capped; sinks: a logit per head in every softmax;
    alibi_slopes: ALiBi (causal only)."""
    if alibi_slopes is not None and not causal:
        raise ValueError("ALiBi needs causal attention")
    if k.stride()[:2] != v.stride()[:2] or k.stride(-1) != 1 or v.stride(-1) != 1:
        k, v = k.contiguous(), v.contiguous()  # one set of row strides serves both
    num_seqs = query_start_loc.shape[0] - 1
    num_q_heads, num_kv_heads, head_dim = q.shape[1], k.shape[1], q.shape[2]
    group_size = num_q_heads // num_kv_heads
    block_m, block_q, num_warps = _tiles(max_query_len, group_size, config)
    grid = (triton.cdiv(max_query_len, block_q), num_seqs, num_kv_heads)
    _prefill_kernel[grid](
        q, k, v, out, query_start_loc, query_start_loc, query_start_loc, query_start_loc,
        q if sinks is None else sinks, q if alibi_slopes is None else alibi_slopes,
        scale * LOG2E, sliding_window, 0,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        0, k.stride(0), k.stride(1), 0,
        G=group_size, BLOCK_Q=block_q, BLOCK_M=block_m, BLOCK_N=config.block_n, D=head_dim,
        BS=1, HAS_WINDOW=sliding_window > 0,
        PREC="ieee" if q.dtype == torch.float32 else "tf32", PAGED=False, CAUSAL=causal,
        SOFTCAP=softcap * LOG2E, SINKS=sinks is not None, ALIBI=alibi_slopes is not None,
        num_warps=num_warps, num_stages=config.num_stages,
    )
    return out
