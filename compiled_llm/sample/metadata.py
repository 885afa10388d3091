"""The batch view of the requests' SamplingParams for one step (SamplingMetadata): tensors
for temperature, top-k/p, min-p and penalties only when some row uses them (gathered by slot
from the sampler's device state), seeded generators, banned ids, logits processors, and the
structured-output bitmask."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from compiled_llm.sample.state import (
    FREQUENCY,
    MIN_P,
    PRESENCE,
    REPETITION,
    TEMPERATURE,
    TOP_K,
    TOP_P,
    SamplingState,
)
from compiled_llm.sample.uploads import upload
from compiled_llm.sampling_params import SAMPLING_EPS, SamplingParams

if TYPE_CHECKING:
    from compiled_llm.core.request import Request

# what a neutral row samples with: greedy, nothing on (its token is never read)
STAND_IN_PARAMS = SamplingParams(temperature=0.0, max_tokens=1)


@dataclass
class SamplingMetadata:
    """One step's sampling parameters by row [B]; an optional tensor is None when no row
    uses it, so an all-greedy batch carries none of temperature, top-k/p, min-p. Built by the
    sampler from its persistent device state (gathered by slot), or by hand."""

    temperature: torch.Tensor | None  # [B] float32, 0.0 = greedy row; None when all_greedy
    all_greedy: bool
    top_k: torch.Tensor | None  # [B] int64, 0 = off; None if no row uses it
    top_p: torch.Tensor | None  # [B] float32, 1.0 = off
    min_p: torch.Tensor | None  # [B] float32, 0.0 = off
    generators: dict[int, torch.Generator]  # row -> that request's seeded generator
    # All three are None together when no row uses any penalty.
    presence_penalty: torch.Tensor | None
    frequency_penalty: torch.Tensor | None
    repetition_penalty: torch.Tensor | None
    output_token_ids: list[list[int]]  # per row, on the host: what logits processors read
    banned_token_ids: dict[int, list[int]]  # row -> ids forced to -inf (e.g. min_tokens)
    logits_processors: dict[int, list[Callable]]  # row -> (output_ids, row_logits) -> row
    max_num_logprobs: int | None  # top-k logprobs for sampled tokens; None = none
    row_errors: dict[int, str] = field(default_factory=dict)  # row -> why it failed (filled in)
    logit_bias: dict[int, dict[int, float]] = field(default_factory=dict)  # row -> id -> bias
    allowed_token_ids: dict[int, list[int]] = field(default_factory=dict)  # row -> only these
    # structured outputs: xgrammar bitmask [B, ceil(V/32)] int32 on the logits' device, and
    # the rows it constrains (others are all-allowed)
    grammar_bitmask: torch.Tensor | None = None
    grammar_rows: list[int] = field(default_factory=list)
    # penalties: [B, V] output-token counts, and the prompt-token mask (None when no row has a
    # repetition penalty); set whenever presence_penalty is
    output_counts: torch.Tensor | None = None
    prompt_mask: torch.Tensor | None = None
    # the sampler's counts row of each row [B] (0: none), to count the sampled tokens in
    penalty_rows: torch.Tensor | None = None
    # known on the host when the batch is built; None means all of the vocabulary
    any_repetition_penalty: bool | None = None
    max_top_k: int | None = None
    # whether some row (a neutral one included) is greedy; None: not known on the host
    any_greedy: bool | None = None

    @property
    def edits_logits(self) -> bool:
        """Whether any step before sampling rewrites logits (else they are used as they are)."""
        return bool(self.logits_processors or self.banned_token_ids or self.logit_bias
                    or self.allowed_token_ids or self.presence_penalty is not None
                    or self.grammar_bitmask is not None)


def drop_out_of_vocab(meta: SamplingMetadata, vocab_size: int) -> None:
    """Fail (in row_errors) each row whose banned, biased or allowed ids fall outside
    [0, vocab_size), and drop those ids: a device index out of range would fail the step
    for every row (on CUDA, the whole context)."""
    for name in ("banned_token_ids", "logit_bias", "allowed_token_ids"):
        by_row = getattr(meta, name)
        for row in [row for row, ids in by_row.items()
                    if not all(0 <= t < vocab_size for t in ids)]:
            meta.row_errors[row] = (f"sampling failed: {name} outside the vocabulary "
                                    f"[0, {vocab_size})")
            del by_row[row]


def make_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """One generator per seeded request, so its draws are independent of batch makeup."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen




def build_sampling_metadata(reqs: list[Request], state: SamplingState, gen_for,
                            neutral: frozenset[int] | set[int] = frozenset()) -> SamplingMetadata:
    """The batch view of the requests' SamplingParams. Per-row values are gathered on the
    device from `state` by slot (one small index copy; none for an all-greedy batch without
    penalties). Neutral rows sample greedily with nothing on: rows whose own data broke the
    batch, and requests that finished after the step was launched (their token is dropped)."""
    neutral = set(neutral)
    params: list[SamplingParams] = []
    live: list[tuple[int, Request, SamplingParams]] = []
    for i, req in enumerate(reqs):
        if i in neutral or req.is_finished:
            neutral.add(i)
            params.append(STAND_IN_PARAMS)
        else:
            params.append(req.sampling_params)
            live.append((i, req, req.sampling_params))
    # one pass over the live rows (neutral rows are greedy with nothing on: they change none)
    all_greedy, any_greedy = True, bool(neutral)  # neutral rows are greedy
    any_repetition, any_penalty, max_num_logprobs = False, False, None
    banned: dict[int, list[int]] = {}
    processors: dict[int, list[Callable]] = {}
    logit_bias: dict[int, dict[int, float]] = {}
    allowed: dict[int, list[int]] = {}
    for i, req, p in live:
        if p.temperature < SAMPLING_EPS:  # p.is_greedy, inlined (hot)
            any_greedy = True
        else:
            all_greedy = False
        if p.repetition_penalty != 1.0:
            any_repetition = any_penalty = True
        elif p.presence_penalty or p.frequency_penalty:
            any_penalty = True
        if p.logprobs is not None and (max_num_logprobs is None or p.logprobs > max_num_logprobs):
            max_num_logprobs = p.logprobs
        # min_tokens: the row samples output token number num_output_tokens + num_pending;
        # vLLM bans every EOS id there, with ignore_eos too (its all_stop_token_ids)
        if len(req.output_token_ids) + req.num_pending < p.min_tokens:
            banned[i] = [*req.eos_token_ids, *p.stop_token_ids]
        if p.logits_processors:
            processors[i] = p.logits_processors
        if p.logit_bias:
            logit_bias[i] = p.logit_bias
        if p.allowed_token_ids:
            allowed[i] = p.allowed_token_ids
    meta = SamplingMetadata(
        temperature=None, all_greedy=all_greedy, top_k=None, top_p=None, min_p=None,
        generators={}, presence_penalty=None, frequency_penalty=None, repetition_penalty=None,
        output_token_ids=[r.output_token_ids for r in reqs], banned_token_ids=banned,
        logits_processors=processors, max_num_logprobs=max_num_logprobs,
        any_repetition_penalty=any_repetition, logit_bias=logit_bias, allowed_token_ids=allowed,
        any_greedy=any_greedy)
    if not meta.all_greedy or any_penalty:
        _gather_params(meta, reqs, params, state, neutral, any_penalty)
    if not meta.all_greedy:
        meta.generators = {i: gen for i, r, _ in live if (gen := gen_for(r)) is not None}
    return meta


def _gather_params(meta: SamplingMetadata, reqs: list[Request], params: list[SamplingParams],
                   state: SamplingState, neutral: set[int], any_penalty: bool) -> None:
    """Temperature, top-k/p, min-p and penalties of each row, gathered from the state's
    tables by slot; a tensor only when some row uses it."""
    slots = state.slots_for(reqs, neutral)
    penalty_rows = state.penalty_rows_for(reqs, neutral) if any_penalty else []
    index = upload(slots + penalty_rows, torch.int64, state.device)
    rows = state.params.index_select(0, index[:len(slots)])
    if not meta.all_greedy:
        meta.temperature = rows[:, TEMPERATURE]
        max_top_k, any_top_p, any_min_p = 0, False, False
        for p in params:  # one pass (hot)
            if p.top_k > max_top_k:
                max_top_k = p.top_k
            any_top_p = any_top_p or p.top_p < 1.0
            any_min_p = any_min_p or p.min_p > 0.0
        if max_top_k:
            meta.top_k = rows[:, TOP_K].to(torch.int64)
            meta.max_top_k = min(max_top_k, state.vocab_size or max_top_k)
        if any_top_p:
            meta.top_p = rows[:, TOP_P]
        if any_min_p:
            meta.min_p = rows[:, MIN_P]
    if any_penalty:
        counts_index = index[len(slots):]
        meta.presence_penalty = rows[:, PRESENCE]
        meta.frequency_penalty = rows[:, FREQUENCY]
        meta.repetition_penalty = rows[:, REPETITION]
        meta.output_counts = state.counts.index_select(0, counts_index)
        if meta.any_repetition_penalty:
            meta.prompt_mask = state.prompt_seen.index_select(0, counts_index)
        meta.penalty_rows = counts_index
