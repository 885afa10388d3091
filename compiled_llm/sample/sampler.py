"""Batched token sampling on device: penalties, masks, temperature, min-p/top-k/top-p, logprobs.

Owns ``Sampler``, which also keeps its per-request state (seeded generators, and parameter
slots and penalty counts on the device) and builds each step's ``SamplingMetadata`` from the
requests alone. A step copies to the device only from pinned memory, never reads the device.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
from torch import nn

from compiled_llm.attention.kernels import kernels_interpreted
from compiled_llm.core.request import Request
from compiled_llm.sample.fused_topk import fused_cuts_pay, fused_rows, one_pass_sample
from compiled_llm.sample.metadata import (
    SamplingMetadata,
    build_sampling_metadata,
    drop_out_of_vocab,
    make_generator,
)
from compiled_llm.sample.state import SamplingState
from compiled_llm.sample.structured_outputs import apply_bitmask, fill_bitmask
from compiled_llm.sample.uploads import send, upload
from compiled_llm.sampling_params import SAMPLING_EPS

__all__ = ["Sampler", "SamplingMetadata", "make_generator", "compute_prompt_logprobs",
           "token_counts"]

logger = logging.getLogger(__name__)

_NEG_INF = float("-inf")


@dataclass
class LogprobsTensors:
    """Column 0 is the chosen token (sampled or prompt target); columns 1..k the top-k."""

    token_ids: torch.Tensor  # [B, k+1] int64
    logprobs: torch.Tensor  # [B, k+1] float32
    ranks: torch.Tensor  # [B] int64, 1-based vocab rank of the column-0 token

    def tolists(self) -> tuple[list[list[int]], list[list[float]], list[int]]:
        """(token ids, logprobs, ranks) as host lists (one device sync)."""
        return self.token_ids.tolist(), self.logprobs.tolist(), self.ranks.tolist()


@dataclass
class SamplerOutput:
    """One sampled token per row, and the logprobs asked for (None when no row asked)."""

    sampled_token_ids: torch.Tensor  # [B] int64
    logprobs: LogprobsTensors | None


# ----------------------------------------------------------------------------- logprobs


def gather_logprobs(logprobs: torch.Tensor, token_ids: torch.Tensor,
                    num_top: int) -> LogprobsTensors:
    """Pack chosen-token logprob + rank and the num_top best of already-normalised
    ``logprobs``."""
    token_ids = token_ids.to(torch.int64)
    chosen = logprobs.gather(1, token_ids.unsqueeze(1))
    # Same convention as vLLM: ties count against the token (rank = #logprobs >= its own).
    ranks = (logprobs >= chosen).sum(dim=-1)
    num_top = min(num_top, logprobs.shape[-1])
    if num_top <= 0:
        return LogprobsTensors(token_ids.unsqueeze(1), chosen, ranks)
    top_vals, top_ids = logprobs.topk(num_top, dim=-1)
    return LogprobsTensors(
        token_ids=torch.cat([token_ids.unsqueeze(1), top_ids], dim=1),
        logprobs=torch.cat([chosen, top_vals], dim=1),
        ranks=ranks,
    )


def compute_prompt_logprobs(
    logits: torch.Tensor, target_ids: torch.Tensor, num_top: int
) -> LogprobsTensors:
    """Logprobs of each next prompt token given its prefix (logits[i] predicts target_ids[i])."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return gather_logprobs(logprobs, target_ids, num_top)


# ----------------------------------------------------------------------------- masks


def apply_logits_processors(logits: torch.Tensor, meta: SamplingMetadata) -> None:
    """Run each row's processors; one that raises fails its row alone (meta.row_errors)."""
    for row, procs in meta.logits_processors.items():
        row_logits = logits[row]
        try:
            for proc in procs:
                row_logits = proc(meta.output_token_ids[row], row_logits)
            # Processors may return a fresh tensor rather than edit the view in place.
            logits[row].copy_(row_logits)
        except Exception as exc:  # user code: contain it to its request
            meta.row_errors[row] = f"logits processor raised {type(exc).__name__}: {exc}"


def apply_banned_ids(logits: torch.Tensor, banned: dict[int, list[int]]) -> None:
    """Set each row's banned token ids to -inf, in place, in one indexed write."""
    rows: list[int] = []
    cols: list[int] = []
    for row, ids in banned.items():
        rows.extend([row] * len(ids))
        cols.extend(ids)
    if rows:
        index = upload([rows, cols], torch.int64, logits.device)
        logits[index[0], index[1]] = _NEG_INF


def apply_logit_bias(logits: torch.Tensor, bias: dict[int, dict[int, float]]) -> None:
    """Add each row's per-token biases, in place, in one indexed write."""
    rows = [row for row, by_id in bias.items() for _ in by_id]
    if not rows:
        return
    cols = [token_id for by_id in bias.values() for token_id in by_id]
    values = [value for by_id in bias.values() for value in by_id.values()]
    index = upload([rows, cols], torch.int64, logits.device)
    logits.index_put_((index[0], index[1]), upload(values, logits.dtype, logits.device),
                      accumulate=True)


def apply_allowed_ids(logits: torch.Tensor, allowed: dict[int, list[int]]) -> None:
    """Set every id but each row's allowed ones to -inf, in place."""
    if not allowed:
        return
    device = logits.device
    local = [k for k, ids in enumerate(allowed.values()) for _ in ids]
    cols = [token_id for ids in allowed.values() for token_id in ids]
    # one copy: [rows | local row of each allowed id | the ids]
    index = upload([*allowed, *local, *cols], torch.int64, device)
    rows, n = index[:len(allowed)], len(allowed)
    keep = torch.zeros(n, logits.shape[-1], dtype=torch.bool, device=device)
    keep[index[n:n + len(local)], index[n + len(local):]] = True
    logits[rows] = logits[rows].masked_fill(~keep, _NEG_INF)


def token_counts(ids: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """[B, V] int32 occurrence counts of each token id per row (for metadata built by hand;
    the sampler keeps its own counts on the device)."""
    counts = torch.zeros(len(ids), vocab, dtype=torch.int32, device=device)
    rows = [row for row, r in enumerate(ids) for _ in r]
    if rows:
        index = upload([rows, [t for r in ids for t in r]], torch.int64, device)
        counts.index_put_((index[0], index[1]), torch.ones_like(index[0], dtype=torch.int32),
                          accumulate=True)
    return counts


def apply_penalties(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    """vLLM semantics: repetition over prompt+output tokens, presence/frequency over output,
    from the metadata's [B, V] output counts and prompt mask."""
    if meta.presence_penalty is None:
        return logits
    assert meta.frequency_penalty is not None and meta.repetition_penalty is not None
    counts = meta.output_counts
    out_seen = counts > 0
    if meta.prompt_mask is not None:  # some row has a repetition penalty
        repetition = meta.repetition_penalty.to(logits.dtype).unsqueeze(1)
        scale = torch.where(out_seen | meta.prompt_mask, repetition, 1.0)
        logits = torch.where(logits > 0, logits / scale, logits * scale)
    logits = logits - meta.frequency_penalty.to(logits.dtype).unsqueeze(1) * counts
    return logits - meta.presence_penalty.to(logits.dtype).unsqueeze(1) * out_seen


# ----------------------------------------------------------------------------- truncation


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> None:
    """Mask (in place) tokens less likely than min_p times their row's most likely one."""
    probs = torch.softmax(logits, dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    logits.masked_fill_(probs < threshold, _NEG_INF)


def _top_k_only(logits: torch.Tensor, top_k: torch.Tensor, max_top_k: int | None = None) -> None:
    vocab = logits.shape[-1]
    top_k = top_k.to(torch.int64).clamp(min=0, max=vocab)
    # no bound known on the host: the whole vocabulary (reading top_k.max() would sync)
    max_top_k = vocab if max_top_k is None else min(max_top_k, vocab)
    if max_top_k == 0:
        return
    # topk(max_top_k) instead of a full sort; ties at the k-th value are all kept.
    top = logits.topk(max_top_k, dim=-1).values
    kth = top.gather(1, (top_k - 1).clamp(min=0).unsqueeze(1))
    kth = kth.masked_fill(top_k.unsqueeze(1) == 0, _NEG_INF)
    logits.masked_fill_(logits < kth, _NEG_INF)


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None,
                      top_p: torch.Tensor | None, max_top_k: int | None = None) -> None:
    """Mask (in place) outside top-k, then outside the top-p nucleus of what remains.

    Both cut by value threshold, so tokens tied with the last kept one are kept too: the
    result does not depend on how a sort orders ties.
    """
    if top_p is None:
        if top_k is not None:
            _top_k_only(logits, top_k, max_top_k)
        return
    vocab = logits.shape[-1]
    ascending = logits.sort(dim=-1).values
    if top_k is not None:
        top_k = top_k.to(torch.int64).clamp(min=0, max=vocab)
        kth = ascending.gather(1, (vocab - top_k.clamp(min=1)).unsqueeze(1))
        kth = kth.masked_fill(top_k.unsqueeze(1) == 0, _NEG_INF)
        ascending.masked_fill_(ascending < kth, _NEG_INF)
        logits.masked_fill_(logits < kth, _NEG_INF)
    cum_probs = torch.softmax(ascending, dim=-1).cumsum(dim=-1)
    # cum_probs is non-decreasing, so the dropped tail is a prefix; always keep the top token.
    num_dropped = (cum_probs <= (1.0 - top_p).unsqueeze(1)).sum(dim=-1).clamp(max=vocab - 1)
    cutoff = ascending.gather(1, num_dropped.unsqueeze(1))
    logits.masked_fill_(logits < cutoff, _NEG_INF)


# ----------------------------------------------------------------------------- sampling


def random_sample(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """Exponential race: argmax(p / E), E ~ Exp(1), is an exact draw from p.

    Seeded rows take their noise from their own generator, so their tokens do not depend on
    the rest of the batch; all other rows share one batched draw.
    """
    noise = torch.empty_like(probs)
    if len(generators) < probs.shape[0]:
        noise.exponential_()
    for row, gen in generators.items():
        noise[row].exponential_(generator=gen)
    # An exact 0 draw would give 0/0 = NaN on masked tokens, and argmax favours NaN.
    noise.clamp_(min=torch.finfo(noise.dtype).tiny)
    return probs.div_(noise).argmax(dim=-1)


class Sampler(nn.Module):
    """logits [B, V] + SamplingMetadata -> one sampled token per row (+ optional logprobs).
    `prepare` builds a step's metadata from its requests; the sampler keeps each request's
    state (its seeded generator, its parameter slot and penalty counts on the device) from its
    first sampling step until `release`."""

    def __init__(self, device: torch.device | str = "cpu", vocab_size: int | None = None) -> None:
        super().__init__()
        self.device, self.vocab_size = torch.device(device), vocab_size
        self.generators: dict[str, torch.Generator] = {}
        self.state = SamplingState(self.device, vocab_size)
        # the one-pass sampler's noise: a base drawn from torch's RNG at its first use (so
        # `seed` fixes it; no draw where it never runs), advanced every step
        self._noise_seed: int | None = None
        self.one_pass = (self.device.type == "cuda" or kernels_interpreted()) and \
            os.environ.get("COMPILED_LLM_ONE_PASS_SAMPLING", "1") != "0"
        # rows with cuts in the fused kernel: unset, where it measured faster (fused_cuts_pay);
        # 1: always; 0: never (benchmarks/sampler.py, docs/benchmarks.md)
        self.fused_cuts = os.environ.get("COMPILED_LLM_FUSED_TOPK_SAMPLING", "")

    def prepare(self, reqs: list[Request]) -> SamplingMetadata:
        """The metadata of one step's sampling rows, in row order. A row whose own data
        cannot be batched (an id outside the vocabulary, a value no tensor holds, a grammar
        that raises) is named in row_errors and neutralised; the other rows are unchanged."""
        try:
            return self._build(reqs)
        except Exception as exc:  # one row's data broke the batch: find it, build the rest
            logger.exception("sampling metadata failed for a batch of %d rows", len(reqs))
            return self._build_without_bad_rows(reqs, exc)

    def _build(self, reqs: list[Request], neutral: frozenset[int] = frozenset()
               ) -> SamplingMetadata:
        meta = build_sampling_metadata(reqs, self.state, self._generator, neutral)
        if self.vocab_size is not None:
            drop_out_of_vocab(meta, self.vocab_size)
            if any(r.grammar is not None for r in reqs):  # (hot: most batches have none)
                skip = neutral.union(i for i, r in enumerate(reqs) if r.is_finished)
                bitmask, rows = fill_bitmask(reqs, self.vocab_size, meta.row_errors, skip,
                                             self.device)
                if bitmask is not None:
                    meta.grammar_bitmask = send(bitmask, self.device)
                    meta.grammar_rows = rows
        return meta

    def _build_without_bad_rows(self, reqs: list[Request], exc: Exception) -> SamplingMetadata:
        """Build each row alone to find the ones that raise; batch the others with the bad
        rows neutral (greedy, no state). Re-raises if no single row raises."""
        errors = {}
        for row, req in enumerate(reqs):
            try:
                self._build([req])  # state it makes is the request's own, released with it
            except Exception as row_exc:
                errors[row] = f"sampling failed: {type(row_exc).__name__}: {row_exc}"
        if not errors:
            raise exc
        meta = self._build(reqs, frozenset(errors))
        meta.row_errors.update(errors)
        return meta

    def release(self, request_ids) -> None:
        """Forget the per-request state of these requests (unknown ids are ignored)."""
        request_ids = list(request_ids)
        for request_id in request_ids:
            self.generators.pop(request_id, None)
        self.state.release(request_ids)

    def _generator(self, req: Request) -> torch.Generator | None:
        seed = req.sampling_params.seed
        if seed is None:
            return None
        gen = self.generators.get(req.request_id)
        if gen is None:
            gen = self.generators[req.request_id] = make_generator(seed, self.device)
        return gen

    def forward(self, logits: torch.Tensor, meta: SamplingMetadata) -> SamplerOutput:
        """One token per row of logits [B, V]; the caller's logits are never edited."""
        raw_logprobs = None
        if meta.max_num_logprobs is not None:
            # vLLM v1 default: logprobs describe the model's distribution, pre-processing.
            raw_logprobs = torch.log_softmax(logits.float(), dim=-1)
        if meta.all_greedy and not meta.edits_logits:  # argmax reads logits as they are
            sampled = logits.argmax(dim=-1)
        elif self.one_pass and fused_rows(meta, self._fused_cuts(meta, logits.shape[0])):
            if meta.edits_logits:
                logits = self.process_logits(logits.to(torch.float32, copy=True), meta)
            sampled = one_pass_sample(logits, meta, self._next_noise_seed())
        else:
            # Copy even when already float32 so the caller's logits are never edited in place.
            logits = logits.to(torch.float32, copy=True)
            sampled = self.sample(self.process_logits(logits, meta), meta)
        if meta.penalty_rows is not None:  # the next step's counts include this token
            self.state.add_sampled(meta.penalty_rows, sampled)
        logprobs = None
        if raw_logprobs is not None:
            logprobs = gather_logprobs(raw_logprobs, sampled, meta.max_num_logprobs or 0)
        return SamplerOutput(sampled_token_ids=sampled, logprobs=logprobs)

    def _fused_cuts(self, meta: SamplingMetadata, rows: int) -> bool:
        if self.fused_cuts in ("0", "1"):
            return self.fused_cuts == "1"
        return fused_cuts_pay(meta, rows)

    def _next_noise_seed(self) -> int:
        if self._noise_seed is None:
            self._noise_seed = int(torch.randint(2**31 - 1, (1,)))
        self._noise_seed = (self._noise_seed + 0x9E3779B1) % (2**31 - 1)
        return self._noise_seed

    @staticmethod
    def process_logits(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """Edits before temperature: processors, bias, allowed ids, bans, grammar, penalties."""
        apply_logits_processors(logits, meta)
        apply_logit_bias(logits, meta.logit_bias)
        apply_allowed_ids(logits, meta.allowed_token_ids)
        apply_banned_ids(logits, meta.banned_token_ids)
        if meta.grammar_bitmask is not None:
            apply_bitmask(logits, meta.grammar_bitmask, meta.grammar_rows)
        return apply_penalties(logits, meta)

    @staticmethod
    def sample(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """Tokens [B] from processed float32 logits (edited in place): argmax for greedy
        rows, else temperature, min-p, top-k/p and a draw."""
        if meta.all_greedy:
            return logits.argmax(dim=-1)
        if meta.any_greedy is False:  # known on the host: no argmax to take, none to merge
            return random_sample(Sampler.probs(logits, meta)[0], meta.generators)
        greedy = logits.argmax(dim=-1)
        probs, is_greedy = Sampler.probs(logits, meta)
        sampled = random_sample(probs, meta.generators)
        return torch.where(is_greedy, greedy, sampled)

    @staticmethod
    def probs(logits: torch.Tensor, meta: SamplingMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """(the distribution each row draws from [B, V], which rows are greedy [B]) from
        processed float32 logits of a batch not all greedy (edited in place): temperature,
        min-p, top-k/p, softmax. A greedy row's probs are its temperature-1 softmax."""
        temperature = meta.temperature.to(logits.dtype)
        is_greedy = temperature < SAMPLING_EPS
        # Greedy rows are overwritten by the caller; dividing them by 1 just avoids inf/NaN.
        divisor = temperature if meta.any_greedy is False else torch.where(
            is_greedy, torch.ones_like(temperature), temperature)
        logits = logits.div_(divisor.unsqueeze(1))
        if meta.min_p is not None:
            apply_min_p(logits, meta.min_p)
        apply_top_k_top_p(logits, meta.top_k, meta.top_p, meta.max_top_k)
        return torch.softmax(logits, dim=-1), is_greedy
