"""The shared inner step of the paged attention kernels: one K/V tile of online softmax.
K/V rows come through the block table (unpaged, pooling: at k_base + pos * stride_cs), scores
live in the log2 domain (qk_scale folds in log2(e)), optionally soft-capped (Gemma 2) and
ALiBi-biased (Bloom, MPT), the running max starts finite (or at a head's sink logit, GPT-OSS)
so rows with every key masked stay NaN-free, and FP8 tiles are converted to q's dtype as read."""

import triton
import triton.language as tl


@triton.jit
def kv_scale(scales_ptr, index, FP8: tl.constexpr):
    """An FP8 cache's scale at `index` of its [2, Hkv] scales (K's, then V's); 1.0 otherwise."""
    if FP8:
        return tl.load(scales_ptr + index)
    return 1.0


@triton.jit
def soft_tanh(x):
    """tanh(x) from exp2 (the interpreter and every backend have it): 1 - 2 / (e^2x + 1)."""
    return 1.0 - 2.0 / (tl.exp2(x * 2.8853900817779268) + 1.0)


@triton.jit
def softmax_start(sinks_ptr, head, use, ROWS: tl.constexpr, SINKS: tl.constexpr):
    """(m, l) of ROWS rows before their first key: empty (m finite, l 0), or (SINKS, rows
    where `use`) the sink logit of each row's query head taken as one key of value 0, in the
    log2 domain: m = sink, l = 1 (a split decode starts one split so, the merge does the rest)."""
    m_i = tl.full([ROWS], -1.0e30, tl.float32)
    l_i = tl.zeros([ROWS], tl.float32)
    if SINKS:
        sink = tl.load(sinks_ptr + head, mask=use, other=0.0).to(tl.float32)
        m_i = tl.where(use, sink * 1.4426950408889634, m_i)
        l_i = tl.where(use, 1.0, l_i)
    return m_i, l_i


@triton.jit
def head_slopes(slopes_ptr, head, use, ROWS: tl.constexpr, ALIBI: tl.constexpr):
    """ALiBi's slope of each row's query head [ROWS] in the log2 domain (0: not ALIBI or
    not `use`)."""
    if ALIBI:
        slope = tl.load(slopes_ptr + head, mask=use, other=0.0).to(tl.float32)
        return slope * 1.4426950408889634
    return tl.zeros([ROWS], tl.float32)


@triton.jit
def attend_tile(
    acc, l_i, m_i, q, q_pos, k_base, v_base, table_row, n0, seq_len, window, qk_scale,
    slopes, stride_cb, stride_cs, offs_n, offs_d,
    BS: tl.constexpr, MASKED: tl.constexpr, HAS_WINDOW: tl.constexpr, PREC: tl.constexpr,
    PAGED: tl.constexpr = True, CAUSAL: tl.constexpr = True, FP8: tl.constexpr = False,
    SOFTCAP: tl.constexpr = 0.0, ALIBI: tl.constexpr = False,
):
    """One online-softmax step of rows q [M, D] (at positions q_pos) over keys n0..n0+N-1 read
    through the block table (or, unpaged, at row stride stride_cs). MASKED: keys >= seq_len,
    (CAUSAL) after q_pos or (HAS_WINDOW) at or before q_pos - window (and, not CAUSAL, at or
    after q_pos + window) are hidden; unmasked tiles must be fully visible and below seq_len.
    FP8: K/V are converted to q's dtype as read; their scales are the caller's (folded into
    qk_scale and the output). SOFTCAP > 0:
    scores soft-capped, cap * tanh(score / cap), with the cap in the log2 domain too. ALIBI:
    slopes [M] (log2 domain, head_slopes) * (key pos - query pos) joins each score."""
    pos = n0 + offs_n  # [N] key positions
    valid = pos < seq_len
    if not PAGED:
        kv_off = (pos.to(tl.int64) * stride_cs)[:, None] + offs_d[None, :]  # [N, D]
    elif MASKED:
        blk = tl.load(table_row + pos // BS, mask=valid, other=0).to(tl.int64)
        kv_off = (blk * stride_cb + (pos % BS) * stride_cs)[:, None] + offs_d[None, :]
    else:
        blk = tl.load(table_row + pos // BS).to(tl.int64)
        kv_off = (blk * stride_cb + (pos % BS) * stride_cs)[:, None] + offs_d[None, :]
    if MASKED:
        k = tl.load(k_base + kv_off, mask=valid[:, None], other=0.0)
    else:
        k = tl.load(k_base + kv_off)
    if FP8:
        k = k.to(q.dtype)
    s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale  # [M, N], log2 domain
    if SOFTCAP > 0:
        s = SOFTCAP * soft_tanh(s / SOFTCAP)
    if ALIBI:
        s += slopes[:, None] * (pos[None, :] - q_pos[:, None]).to(tl.float32)
    if MASKED:
        vis = valid[None, :] & (q_pos[:, None] >= 0)  # [M, N]
        if CAUSAL:
            vis = vis & (pos[None, :] <= q_pos[:, None])
        if HAS_WINDOW:
            vis = vis & (pos[None, :] > q_pos[:, None] - window)
            if not CAUSAL:  # bidirectional: as far after as before
                vis = vis & (pos[None, :] < q_pos[:, None] + window)
        s = tl.where(vis, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))  # m_i starts finite: fully masked rows stay NaN-free
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if MASKED:
        v = tl.load(v_base + kv_off, mask=valid[:, None], other=0.0)
    else:
        v = tl.load(v_base + kv_off)
    if FP8:
        v = v.to(q.dtype)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
    return acc, l_i, m_new
