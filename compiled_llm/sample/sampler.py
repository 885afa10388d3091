"""Batched token sampling on device: penalties, masks, temperature, min-p/top-k/top-p, logprobs.

Owns ``Sampler``, which also keeps its per-request device state (seeded generators) and
builds each step's ``SamplingMetadata`` from the requests alone. Per-row Python work is
limited to seeded rows, logits processors and banned ids.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from compiled_llm.core.request import Request
from compiled_llm.sample.metadata import (
    SamplingMetadata,
    build_sampling_metadata,
    drop_out_of_vocab,
    make_generator,
)
from compiled_llm.sample.structured_outputs import apply_bitmask, fill_bitmask
from compiled_llm.sampling_params import SAMPLING_EPS, SamplingParams

# what a row whose own data broke the batch samples with (its request fails; nothing is read)
_STAND_IN_PARAMS = SamplingParams(temperature=0.0, max_tokens=1)

__all__ = ["Sampler", "SamplingMetadata", "make_generator", "compute_prompt_logprobs"]

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
        row_index = torch.tensor(rows, dtype=torch.int64, device=logits.device)
        col_index = torch.tensor(cols, dtype=torch.int64, device=logits.device)
        logits[row_index, col_index] = _NEG_INF


def apply_logit_bias(logits: torch.Tensor, bias: dict[int, dict[int, float]]) -> None:
    """Add each row's per-token biases, in place, in one indexed write."""
    rows = [row for row, by_id in bias.items() for _ in by_id]
    if not rows:
        return
    cols = [token_id for by_id in bias.values() for token_id in by_id]
    values = [value for by_id in bias.values() for value in by_id.values()]
    device = logits.device
    index = (torch.tensor(rows, device=device), torch.tensor(cols, device=device))
    logits.index_put_(index, torch.tensor(values, dtype=logits.dtype, device=device),
                      accumulate=True)


def apply_allowed_ids(logits: torch.Tensor, allowed: dict[int, list[int]]) -> None:
    """Set every id but each row's allowed ones to -inf, in place."""
    if not allowed:
        return
    device = logits.device
    rows = torch.tensor(list(allowed), device=device)
    keep = torch.zeros(len(allowed), logits.shape[-1], dtype=torch.bool, device=device)
    local = [k for k, ids in enumerate(allowed.values()) for _ in ids]
    cols = [token_id for ids in allowed.values() for token_id in ids]
    keep[torch.tensor(local, device=device), torch.tensor(cols, device=device)] = True
    logits[rows] = logits[rows].masked_fill(~keep, _NEG_INF)


def _token_counts(ids: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """[B, V] int64 occurrence counts of each token id per row."""
    max_len = max((len(r) for r in ids), default=0)
    if max_len == 0:
        return torch.zeros(len(ids), vocab, dtype=torch.int64, device=device)
    # Pad with an extra bin (id == vocab) that is dropped afterwards.
    padded = torch.tensor(
        [r + [vocab] * (max_len - len(r)) for r in ids], dtype=torch.int64, device=device
    )
    counts = torch.zeros(len(ids), vocab + 1, dtype=torch.int64, device=device)
    counts.scatter_add_(1, padded, torch.ones_like(padded))
    return counts[:, :vocab]


def apply_penalties(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    """vLLM semantics: repetition over prompt+output tokens, presence/frequency over output."""
    if meta.presence_penalty is None:
        return logits
    assert meta.frequency_penalty is not None and meta.repetition_penalty is not None
    vocab = logits.shape[-1]
    out_counts = _token_counts(meta.output_token_ids, vocab, logits.device)
    out_seen = out_counts > 0
    repetition = meta.repetition_penalty.to(logits.dtype).unsqueeze(1)
    any_repetition = meta.any_repetition_penalty
    if any_repetition or (any_repetition is None and bool((repetition != 1.0).any())):
        # Prompt counts are the costly part (long prompts); skip them when no row needs them.
        seen = out_seen | (_token_counts(meta.prompt_token_ids, vocab, logits.device) > 0)
        scale = torch.where(seen, repetition, torch.ones_like(repetition))
        logits = torch.where(logits > 0, logits / scale, logits * scale)
    logits = logits - meta.frequency_penalty.to(logits.dtype).unsqueeze(1) * out_counts
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
    max_top_k = min(int(top_k.max()) if max_top_k is None else max_top_k, vocab)
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
    `prepare` builds a step's metadata from its requests; the sampler keeps each seeded
    request's generator from its first step until `release`."""

    def __init__(self, device: torch.device | str = "cpu", vocab_size: int | None = None) -> None:
        super().__init__()
        self.device, self.vocab_size = torch.device(device), vocab_size
        self.generators: dict[str, torch.Generator] = {}

    def prepare(self, reqs: list[Request]) -> SamplingMetadata:
        """The metadata of one step's sampling rows, in row order. A row whose own data
        cannot be batched (an id outside the vocabulary, a value no tensor holds, a grammar
        that raises) is named in row_errors and neutralised; the other rows are unchanged."""
        try:
            return self._build(reqs)
        except Exception as exc:  # one row's data broke the batch: find it, build the rest
            logger.exception("sampling metadata failed for a batch of %d rows", len(reqs))
            return self._build_without_bad_rows(reqs, exc)

    def _build(self, reqs: list[Request]) -> SamplingMetadata:
        meta = build_sampling_metadata(reqs, self.device, self._generator)
        if self.vocab_size is not None:
            drop_out_of_vocab(meta, self.vocab_size)
            bitmask, rows = fill_bitmask(reqs, self.vocab_size, meta.row_errors)
            if bitmask is not None:
                meta.grammar_bitmask = bitmask.to(self.device, non_blocking=True)
                meta.grammar_rows = rows
        return meta

    def _build_without_bad_rows(self, reqs: list[Request], exc: Exception) -> SamplingMetadata:
        """Build each row alone to find the ones that raise; batch the others with stand-ins
        (greedy, no state) in the bad rows' places. Re-raises if no single row raises."""
        errors = {}
        for row, req in enumerate(reqs):
            try:
                self._build([req])  # builds no tensors a later step depends on
            except Exception as row_exc:
                errors[row] = f"sampling failed: {type(row_exc).__name__}: {row_exc}"
        if not errors:
            raise exc
        stand_ins = [Request(req.request_id, [0], _STAND_IN_PARAMS) if row in errors else req
                     for row, req in enumerate(reqs)]
        meta = self._build(stand_ins)
        meta.row_errors.update(errors)
        return meta

    def release(self, request_ids) -> None:
        """Forget the per-request state of these requests (unknown ids are ignored)."""
        for request_id in request_ids:
            self.generators.pop(request_id, None)

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
        else:
            # Copy even when already float32 so the caller's logits are never edited in place.
            logits = logits.to(torch.float32, copy=True)
            sampled = self.sample(self.process_logits(logits, meta), meta)
        logprobs = None
        if raw_logprobs is not None:
            logprobs = gather_logprobs(raw_logprobs, sampled, meta.max_num_logprobs or 0)
        return SamplerOutput(sampled_token_ids=sampled, logprobs=logprobs)

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
        greedy = logits.argmax(dim=-1)
        if meta.all_greedy:
            return greedy
        temperature = meta.temperature.to(logits.dtype)
        is_greedy = temperature < SAMPLING_EPS
        # Greedy rows are overwritten below; dividing them by 1 just avoids inf/NaN.
        divisor = torch.where(is_greedy, torch.ones_like(temperature), temperature)
        logits = logits.div_(divisor.unsqueeze(1))
        if meta.min_p is not None:
            apply_min_p(logits, meta.min_p)
        apply_top_k_top_p(logits, meta.top_k, meta.top_p, meta.max_top_k)
        sampled = random_sample(torch.softmax(logits, dim=-1), meta.generators)
        return torch.where(is_greedy, greedy, sampled)
