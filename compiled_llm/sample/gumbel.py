"""Temperature sampling in one pass over the logits (Triton): argmax(logits / T + Gumbel noise)
is an exact draw from softmax(logits / T), so no probabilities, softmax or noise tensor are
made. Greedy rows (T = 0) take the plain argmax. Used on CUDA for rows without top-k/p, min-p
or a seed of their own; everything else goes through the sampler's general path."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from compiled_llm.attention.kernels.decode import sm_count
from compiled_llm.sampling_params import SAMPLING_EPS

BLOCK = 1024  # logits per inner step of a program


@triton.jit
def _gumbel_scores(logits_ptr, cols, vocab, uniform, greedy, inv_t):
    """Scores of one quarter tile: the logit (greedy) or logit / T + Gumbel(uniform), where a
    uniform of 0 gives -inf noise (never picked)."""
    ok = cols < vocab
    logit = tl.load(logits_ptr + cols, mask=ok, other=float("-inf")).to(tl.float32)
    score = tl.where(greedy, logit, logit * inv_t - tl.log(-tl.log(uniform)))
    return tl.where(ok, score, float("-inf"))


@triton.jit
def _quarter(row_ptr, cols, vocab, uniform, greedy, inv_t, best, best_idx):
    """The running (best score, its column) per lane after one quarter tile."""
    score = _gumbel_scores(row_ptr, cols, vocab, uniform, greedy, inv_t)
    take = score > best
    return tl.where(take, score, best), tl.where(take, cols, best_idx)


@triton.jit(do_not_specialize=["seed"])
def _gumbel_argmax_kernel(
    logits_ptr, temperature_ptr, best_ptr, best_idx_ptr, seed, vocab, stride_row, chunk,
    EPS: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    part = tl.program_id(1)
    temperature = tl.load(temperature_ptr + row)
    greedy = temperature < EPS
    inv_t = 1.0 / tl.where(greedy, 1.0, temperature)
    quarter: tl.constexpr = BLOCK // 4
    offs = tl.arange(0, quarter)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    best = tl.full([quarter], float("-inf"), tl.float32)
    best_idx = tl.zeros([quarter], tl.int32)
    start = part * chunk
    for col0 in range(start, tl.minimum(start + chunk, vocab), BLOCK):
        # one Philox call gives four uniforms in [0, 1): one per quarter of the tile; a row
        # owns cdiv(vocab, BLOCK) * quarter counters, a tile the next quarter of them
        counters = row * (tl.cdiv(vocab, BLOCK) * quarter) + col0 // 4 + offs
        rand0, rand1, rand2, rand3 = tl.rand4x(seed, counters)
        best, best_idx = _quarter(row_ptr, col0 + offs, vocab, rand0, greedy, inv_t, best,
                                  best_idx)
        best, best_idx = _quarter(row_ptr, col0 + quarter + offs, vocab, rand1, greedy, inv_t,
                                  best, best_idx)
        best, best_idx = _quarter(row_ptr, col0 + 2 * quarter + offs, vocab, rand2, greedy,
                                  inv_t, best, best_idx)
        best, best_idx = _quarter(row_ptr, col0 + 3 * quarter + offs, vocab, rand3, greedy,
                                  inv_t, best, best_idx)
    top = tl.max(best, 0)
    # the lowest column among the maxima, as torch.argmax picks
    top_idx = tl.min(tl.where(best == top, best_idx, 2147483647), 0)
    tl.store(best_ptr + row * tl.num_programs(1) + part, top)
    tl.store(best_idx_ptr + row * tl.num_programs(1) + part, top_idx)


def gumbel_sample(logits: torch.Tensor, temperature: torch.Tensor, seed: int) -> torch.Tensor:
    """Tokens [B] int64 drawn from softmax(logits / temperature) per row of logits [B, V]
    (any float dtype); rows with temperature < SAMPLING_EPS take the
    argmax. `seed` (a host int) picks the step's noise; no host sync, logits are not edited."""
    num_rows, vocab = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    if num_rows * vocab >= 2**31:
        raise ValueError(f"gumbel_sample: {num_rows} rows x {vocab} ids overflow the counter")
    want = triton.cdiv(4 * sm_count(logits.device), max(num_rows, 1))
    parts = max(1, min(want, triton.cdiv(vocab, BLOCK)))
    chunk = triton.cdiv(triton.cdiv(vocab, parts), BLOCK) * BLOCK
    parts = triton.cdiv(vocab, chunk)
    best = torch.empty(num_rows, parts, dtype=torch.float32, device=logits.device)
    best_idx = torch.empty(num_rows, parts, dtype=torch.int32, device=logits.device)
    _gumbel_argmax_kernel[(num_rows, parts)](
        logits, temperature, best, best_idx, seed, vocab, logits.stride(0), chunk,
        EPS=SAMPLING_EPS, BLOCK=BLOCK, num_warps=4,
    )
    pick = best.argmax(dim=1, keepdim=True)  # the first part holding the row's maximum
    return best_idx.gather(1, pick).squeeze(1).to(torch.int64)
