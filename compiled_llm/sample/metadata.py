"""The batch view of the requests' SamplingParams for one step (SamplingMetadata): tensors
for temperature, top-k/p, min-p and penalties only when some row uses them, seeded generators,
banned ids, logits processors, and the structured-output bitmask."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from compiled_llm.core.request import Request


@dataclass
class SamplingMetadata:
    """One step's sampling parameters by row [B]; an optional tensor is None when no row
    uses it, so an all-greedy batch carries none of temperature, top-k/p, min-p."""

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
    prompt_token_ids: list[list[int]]  # per row; only read (and set) for repetition penalty
    output_token_ids: list[list[int]]  # per row
    banned_token_ids: dict[int, list[int]]  # row -> ids forced to -inf (e.g. min_tokens)
    logits_processors: dict[int, list[Callable]]  # row -> (output_ids, row_logits) -> row
    max_num_logprobs: int | None  # top-k logprobs for sampled tokens; None = none
    row_errors: dict[int, str] = field(default_factory=dict)  # row -> why it failed (filled in)
    logit_bias: dict[int, dict[int, float]] = field(default_factory=dict)  # row -> id -> bias
    allowed_token_ids: dict[int, list[int]] = field(default_factory=dict)  # row -> only these
    # structured outputs: xgrammar bitmask [B, ceil(V/32)] int32 on the logits' device, and
    # the rows it constrains (others are unconstrained)
    grammar_bitmask: torch.Tensor | None = None
    grammar_rows: list[int] = field(default_factory=list)
    # known on the host when the batch is built; None means read them off the tensors (a sync)
    any_repetition_penalty: bool | None = None
    max_top_k: int | None = None

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


def build_sampling_metadata(reqs: list[Request], device: torch.device, gen_for) -> SamplingMetadata:
    """The batch view of the requests' SamplingParams; optional tensors only when used (an
    all-greedy batch builds none for temperature, top-k/p, min-p or generators)."""
    params = [r.sampling_params for r in reqs]
    floats = lambda values: torch.tensor(values, dtype=torch.float32, device=device)  # noqa: E731
    all_greedy = all(p.is_greedy for p in params)
    any_repetition = any(p.repetition_penalty != 1.0 for p in params)
    any_penalty = any_repetition or any(p.presence_penalty or p.frequency_penalty for p in params)
    banned = {i: [*(() if r.sampling_params.ignore_eos else r.eos_token_ids),
                  *r.sampling_params.stop_token_ids]
              for i, r in enumerate(reqs) if r.num_output_tokens < r.sampling_params.min_tokens}
    processors = {i: p.logits_processors for i, p in enumerate(params) if p.logits_processors}
    logprob_counts = [p.logprobs for p in params if p.logprobs is not None]
    meta = SamplingMetadata(
        temperature=None, all_greedy=all_greedy, top_k=None, top_p=None, min_p=None,
        generators={},
        presence_penalty=floats([p.presence_penalty for p in params]) if any_penalty else None,
        frequency_penalty=floats([p.frequency_penalty for p in params]) if any_penalty else None,
        repetition_penalty=floats([p.repetition_penalty for p in params]) if any_penalty else None,
        prompt_token_ids=[r.prompt_token_ids for r in reqs] if any_repetition else [],
        output_token_ids=[r.output_token_ids for r in reqs],
        banned_token_ids=banned,
        logits_processors=processors,
        max_num_logprobs=max(logprob_counts) if logprob_counts else None,
        any_repetition_penalty=any_repetition,
        logit_bias={i: p.logit_bias for i, p in enumerate(params) if p.logit_bias},
        allowed_token_ids={i: p.allowed_token_ids for i, p in enumerate(params)
                           if p.allowed_token_ids},
    )
    if not all_greedy:
        _random_sampling_fields(meta, reqs, params, floats, gen_for)
    return meta


def _random_sampling_fields(meta: SamplingMetadata, reqs: list[Request], params, floats,
                            gen_for) -> None:
    """Temperature, top-k/p, min-p and seeded generators: only a batch with a random row."""
    meta.temperature = floats([0.0 if p.is_greedy else p.temperature for p in params])
    top_k = [p.top_k for p in params]
    if any(top_k):
        meta.top_k = torch.tensor(top_k, device=meta.temperature.device)
        meta.max_top_k = max(top_k)
    meta.top_p = floats([p.top_p for p in params]) if any(p.top_p < 1.0 for p in params) else None
    meta.min_p = floats([p.min_p for p in params]) if any(p.min_p > 0.0 for p in params) else None
    meta.generators = {i: gen for i, r in enumerate(reqs) if (gen := gen_for(r)) is not None}
