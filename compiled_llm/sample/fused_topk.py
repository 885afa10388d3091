"""Temperature + top-k / top-p / min-p sampling without a sort (Triton), one program per row:
sweeps over s = logits / T find the max, the top-k and top-p cuts (a search over float32
sortable keys) and the normaliser, then a Gumbel-max sweep draws among {s >= cut}, ties with
the cut kept as apply_top_k_top_p / apply_min_p define them; greedy rows take the argmax.
Seeded rows keep the general path (`fused_rows`); the Sampler picks it where it measured faster."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from compiled_llm.sample.gumbel import gumbel_sample
from compiled_llm.sample.metadata import SamplingMetadata
from compiled_llm.sampling_params import SAMPLING_EPS

BLOCK = 512  # logits per step of a sweep
PIVOTS = 16  # candidate cuts one search sweep tests: 2**32 keys in 8 sweeps
NEG_INF_KEY = tl.constexpr(-2139095041)  # _sortable(-inf): the lowest key of a non-NaN float32
# above every key (+inf's is 2139095040): keys and bounds stay int32, as the GPU compares,
# takes min / max of 64-bit integers in several instructions each
MAX_KEY = tl.constexpr(2147483647)


@triton.jit
def _sortable(s):
    """int32 keys in the order of the float32 values (-0.0 and +0.0 one key)."""
    s = tl.where(s == 0.0, 0.0, s)
    bits = s.to(tl.int32, bitcast=True)
    # negative floats order backwards by their bits: flip all but the sign
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _scaled(row_ptr, cols, vocab, temperature):
    """A tile of the row's logits / T (-inf past the vocabulary), divided as the general path
    divides, so ties and cuts fall on the same float32 values."""
    x = tl.load(row_ptr + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
    return x / temperature


@triton.jit
def _row_max(row_ptr, vocab, temperature, end, BLOCK: tl.constexpr):
    """max(logits / T) over the row (-inf when end is 0: the sweep is skipped)."""
    offs = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    for col0 in range(0, end, BLOCK):
        best = tl.maximum(best, _scaled(row_ptr, col0 + offs, vocab, temperature))
    return tl.max(best, 0)


@triton.jit
def _pivots(lo, hi, PIVOTS: tl.constexpr):
    """PIVOTS int32 keys spread over [lo + 1, hi - 1], as a [PIVOTS, 1] column; hi - lo can
    pass 2**31, so the spacing is worked out in int64 on these PIVOTS values only."""
    steps = tl.arange(0, PIVOTS).to(tl.int64)
    first = lo.to(tl.int64) + 1
    return (first + (hi.to(tl.int64) - first) * steps // PIVOTS).to(tl.int32)[:, None]


@triton.jit
def _top_k_cut(row_ptr, vocab, temperature, top, min_p, k, lo, hi,
               BLOCK: tl.constexpr, PIVOTS: tl.constexpr):
    """The largest key with at least k min-p-kept tokens at or above it, searched in (lo, hi)
    where hi has fewer than k; lo when no key in between has k (no top-k cut)."""
    offs = tl.arange(0, BLOCK)
    while lo + 1 < hi:  # not hi - lo > 1: that int32 difference can overflow
        pivots = _pivots(lo, hi, PIVOTS)
        # [PIVOTS, BLOCK] partials, reduced once a sweep rather than once a tile; pivots on
        # the first axis keep a column's pivots in one thread (its key computed once).
        # float32 counts: one predicated add a pair (int32 ones compile to several), exact
        # up to 2**24 tokens a row
        counts = tl.zeros([PIVOTS, BLOCK], tl.float32)
        above = tl.full([PIVOTS, BLOCK], MAX_KEY, tl.int32)  # least token key >= each pivot
        below = tl.full([PIVOTS, BLOCK], NEG_INF_KEY, tl.int32)  # greatest one < each pivot
        for col0 in range(0, vocab, BLOCK):
            s = _scaled(row_ptr, col0 + offs, vocab, temperature)
            key = tl.where(tl.exp(s - top) >= min_p, _sortable(s), NEG_INF_KEY)[None, :]
            over = key >= pivots
            counts = tl.where(over, counts + 1.0, counts)
            above = tl.where(over, tl.minimum(above, key), above)
            below = tl.where(over, below, tl.maximum(below, key))
        enough = tl.sum(counts, 1) >= k
        # counts only change at token keys: snap to them, so few distinct values end it early
        lo = tl.maximum(lo, tl.max(tl.where(enough, tl.min(above, 1), lo), 0))
        hi = tl.minimum(hi, tl.min(tl.where(enough, hi, tl.max(below, 1) + 1), 0))
    return lo


@triton.jit
def _kept_exp(s, top, min_p, cut):
    """exp(s - max) of the tokens min-p and the cut keep, 0 for the others."""
    weight = tl.exp(s - top)
    return tl.where((weight >= min_p) & (_sortable(s) >= cut), weight, 0.0)


@triton.jit
def _top_p_cut(row_ptr, vocab, temperature, top, min_p, cut, total, tail, lo, hi,
               BLOCK: tl.constexpr, PIVOTS: tl.constexpr):
    """The smallest key whose kept mass at or below it exceeds tail (= 1 - top_p), searched
    in (lo, hi] where lo's mass does not; hi when none in between does (the top token)."""
    offs = tl.arange(0, BLOCK)
    while lo + 1 < hi:
        pivots = _pivots(lo, hi, PIVOTS)
        # per-column partials as in _top_k_cut (each then summed in one fixed order)
        mass = tl.zeros([PIVOTS, BLOCK], tl.float32)
        at_or_below = tl.full([PIVOTS, BLOCK], NEG_INF_KEY, tl.int32)  # greatest kept key <=
        above = tl.full([PIVOTS, BLOCK], MAX_KEY, tl.int32)  # least kept key > each pivot
        for col0 in range(0, vocab, BLOCK):
            s = _scaled(row_ptr, col0 + offs, vocab, temperature)
            weight = _kept_exp(s, top, min_p, cut)
            # dropped tokens take the lowest key: at or below every pivot (>= lo + 1 >= cut),
            # they add weight 0 and the identity of the max and of the min
            key = tl.where(weight > 0.0, _sortable(s), NEG_INF_KEY)[None, :]
            below = key <= pivots
            mass = tl.where(below, mass + weight[None, :], mass)
            at_or_below = tl.where(below, tl.maximum(at_or_below, key), at_or_below)
            above = tl.where(below, above, tl.minimum(above, key))
        over = tl.sum(mass, 1) / total > tail
        # the mass only changes at kept keys: snap to them (few distinct values end it early)
        hi = tl.minimum(hi, tl.min(tl.where(over, tl.max(at_or_below, 1), hi), 0))
        lo = tl.maximum(lo, tl.max(tl.where(over, lo, tl.min(above, 1) - 1), 0))
        lo = tl.minimum(lo, hi - 1)  # all the mass within tail (rounding): keep hi
    return hi


@triton.jit
def _kept_total(row_ptr, vocab, temperature, top, min_p, cut, end, BLOCK: tl.constexpr):
    """The softmax normaliser of the kept tokens (0 when end is 0: the sweep is skipped)."""
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for col0 in range(0, end, BLOCK):
        acc += _kept_exp(_scaled(row_ptr, col0 + offs, vocab, temperature), top, min_p, cut)
    return tl.sum(acc, 0)


@triton.jit
def _draw(row_ptr, vocab, temperature, top, min_p, cut, greedy, seed, counter0, kept_ptr,
          BLOCK: tl.constexpr, STORE_KEPT: tl.constexpr):
    """argmax of s + Gumbel noise over the kept tokens (of the logits, greedy rows); the lowest
    column among equal maxima, as torch.argmax picks. STORE_KEPT writes the kept set (tests)."""
    offs = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_idx = tl.zeros([BLOCK], tl.int32)
    for col0 in range(0, vocab, BLOCK):
        cols = col0 + offs
        s = _scaled(row_ptr, cols, vocab, temperature)
        keep = (tl.exp(s - top) >= min_p) & (_sortable(s) >= cut)
        keep = tl.where(greedy, True, keep) & (cols < vocab)
        if STORE_KEPT:
            tl.store(kept_ptr + cols, keep.to(tl.int8), mask=cols < vocab)
        uniform = tl.rand(seed, counter0 + cols)
        score = tl.where(greedy, s, s - tl.log(-tl.log(uniform)))
        score = tl.where(keep, score, float("-inf"))
        take = score > best
        best, best_idx = tl.where(take, score, best), tl.where(take, cols, best_idx)
    best_top = tl.max(best, 0)
    return tl.min(tl.where(best == best_top, best_idx, 2147483647), 0)


@triton.jit(do_not_specialize=["seed"])
def _fused_topk_sample_kernel(
    logits_ptr, temperature_ptr, top_k_ptr, top_p_ptr, min_p_ptr, out_ptr, kept_ptr, seed,
    vocab, stride_row, STORE_KEPT: tl.constexpr, HAS_TOP_K: tl.constexpr,
    HAS_TOP_P: tl.constexpr, HAS_MIN_P: tl.constexpr, EPS: tl.constexpr,
    BLOCK: tl.constexpr, PIVOTS: tl.constexpr,
):
    row = tl.program_id(0)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    temperature = tl.load(temperature_ptr + row)
    greedy = temperature < EPS
    temperature = tl.where(greedy, 1.0, temperature)
    k = tl.full([], 0, tl.int32)
    top_p = tl.full([], 1.0, tl.float32)
    min_p = tl.full([], 0.0, tl.float32)
    if HAS_TOP_K:
        k = tl.load(top_k_ptr + row).to(tl.int32)
    if HAS_TOP_P:
        top_p = tl.load(top_p_ptr + row)
    if HAS_MIN_P:
        min_p = tl.where(greedy, 0.0, tl.load(min_p_ptr + row))
    use_k = (k > 0) & (k < vocab) & ~greedy
    use_p = (top_p < 1.0) & ~greedy
    # greedy rows skip every sweep but the last (no cut: their max only has to be finite)
    top = _row_max(row_ptr, vocab, temperature, tl.where(greedy, 0, vocab), BLOCK)
    top = tl.where(greedy, 0.0, top)
    top_key = _sortable(top)
    cut = tl.full([], NEG_INF_KEY, tl.int32)
    # absent cuts are left out at compile time: Triton 3.6 fails to compile the search loop
    # once a constant k folds its counts away. The searches step BLOCK // 2 logits: their
    # [PIVOTS, step] partials then fit two programs an SM (<= 128 registers a thread)
    if HAS_TOP_K:
        cut = _top_k_cut(row_ptr, vocab, temperature, top, min_p, k, cut,
                         tl.where(use_k, top_key + 1, cut + 1), BLOCK // 2, PIVOTS)
    if HAS_TOP_P:
        total = _kept_total(row_ptr, vocab, temperature, top, min_p, cut,
                            tl.where(use_p, vocab, 0), BLOCK)
        tail = 1.0 - top_p  # as the general path rounds it
        cut = _top_p_cut(row_ptr, vocab, temperature, top, min_p, cut, total, tail, cut - 1,
                         tl.where(use_p, top_key, cut), BLOCK // 2, PIVOTS)
    token = _draw(row_ptr, vocab, temperature, top, min_p, cut, greedy, seed, row * vocab,
                  kept_ptr + row.to(tl.int64) * vocab, BLOCK, STORE_KEPT)
    tl.store(out_ptr + row, token.to(tl.int64))


def fused_topk_sample(logits: torch.Tensor, temperature: torch.Tensor,
                      top_k: torch.Tensor | None, top_p: torch.Tensor | None,
                      min_p: torch.Tensor | None, seed: int,
                      kept: torch.Tensor | None = None) -> torch.Tensor:
    """Tokens [B] int64 from softmax of logits [B, V] / T after min-p, top-k and top-p, as the
    general path masks them (greedy rows: the argmax); no host sync, logits not edited."""
    num_rows, vocab = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    if num_rows * vocab >= 2**31:
        raise ValueError(f"fused_topk_sample: {num_rows} rows x {vocab} ids overflow the counter")
    out = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    if num_rows == 0:
        return out
    # kept: an int8 [B, V] tensor that receives each row's kept set (for tests)
    _fused_topk_sample_kernel[(num_rows,)](
        logits, temperature, temperature if top_k is None else top_k,
        temperature if top_p is None else top_p, temperature if min_p is None else min_p,
        out, out if kept is None else kept, seed, vocab, logits.stride(0),
        STORE_KEPT=kept is not None, HAS_TOP_K=top_k is not None,
        HAS_TOP_P=top_p is not None, HAS_MIN_P=min_p is not None, EPS=SAMPLING_EPS,
        BLOCK=BLOCK, PIVOTS=PIVOTS, num_warps=8,
    )
    return out


# rows from which the fused kernel beat the sort for batches with top-p on the H200 (call 32:
# 1.34x at 64, 2.0-2.4x at 256; 0.3-0.5x at 1-8), and with top-k alone it never did
FUSED_TOP_P_MIN_ROWS = 64


def fused_cuts_pay(meta: SamplingMetadata, rows: int) -> bool:
    """Whether the fused top-k/top-p/min-p kernel is the faster for this batch, as measured:
    min-p as the only cut (no search), or top-p rows in a batch of FUSED_TOP_P_MIN_ROWS+."""
    if meta.top_k is None and meta.top_p is None:
        return True
    return meta.top_p is not None and rows >= FUSED_TOP_P_MIN_ROWS


def fused_rows(meta: SamplingMetadata, with_cuts: bool) -> bool:
    """Whether the one-pass kernels serve the batch: temperature rows (greedy ones too) and
    no seeded generator (those keep their own noise); with top-k, top-p or min-p only when
    with_cuts (the Sampler's choice: fused_cuts_pay, or its environment flag)."""
    if meta.temperature is None or meta.generators:
        return False
    return with_cuts or (meta.top_k is None and meta.top_p is None and meta.min_p is None)


def one_pass_sample(logits: torch.Tensor, meta: SamplingMetadata, seed: int) -> torch.Tensor:
    """Tokens [B] for a batch `fused_rows` accepts: plain temperature batches take
    gumbel_sample's single sweep, batches with top-k, top-p or min-p the fused kernel."""
    if meta.top_k is None and meta.top_p is None and meta.min_p is None:
        return gumbel_sample(logits, meta.temperature, seed)
    return fused_topk_sample(logits, meta.temperature, meta.top_k, meta.top_p, meta.min_p, seed)
