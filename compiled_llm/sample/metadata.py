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
        return bool(self.logits_processors or self.banned_token_ids
                    or self.presence_penalty is not None or self.grammar_bitmask is not None)


def make_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """One generator per seeded request, so its draws are independent of batch makeup."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def build_sampling_metadata(reqs: list[Request], device: torch.device, gen_for) -> SamplingMetadata:
    """The batch view of the requests' SamplingParams; optional tensors only when used (an
    all-greedy batch builds none for temperature, top-k/p, min-p or generators)."""
    ps = [r.sampling_params for r in reqs]
    f32 = lambda xs: torch.tensor(xs, dtype=torch.float32, device=device)  # noqa: E731
    all_greedy = all(p.is_greedy for p in ps)
    rep = any(p.repetition_penalty != 1.0 for p in ps)
    use_pen = rep or any(p.presence_penalty or p.frequency_penalty for p in ps)
    banned = {i: [*(() if r.sampling_params.ignore_eos else r.eos_token_ids),
                  *r.sampling_params.stop_token_ids]
              for i, r in enumerate(reqs) if r.num_output_tokens < r.sampling_params.min_tokens}
    procs = {i: p.logits_processors for i, p in enumerate(ps) if p.logits_processors}
    k = [p.logprobs for p in ps if p.logprobs is not None]
    meta = SamplingMetadata(
        temperature=None, all_greedy=all_greedy, top_k=None, top_p=None, min_p=None,
        generators={},
        presence_penalty=f32([p.presence_penalty for p in ps]) if use_pen else None,
        frequency_penalty=f32([p.frequency_penalty for p in ps]) if use_pen else None,
        repetition_penalty=f32([p.repetition_penalty for p in ps]) if use_pen else None,
        prompt_token_ids=[r.prompt_token_ids for r in reqs] if rep else [],
        output_token_ids=[r.output_token_ids for r in reqs],
        banned_token_ids=banned,
        logits_processors=procs,
        max_num_logprobs=max(k) if k else None,
        any_repetition_penalty=rep,
    )
    if not all_greedy:
        _random_sampling_fields(meta, reqs, ps, f32, gen_for)
    return meta


def _random_sampling_fields(meta: SamplingMetadata, reqs: list[Request], ps, f32, gen_for):
    meta.temperature = f32([0.0 if p.is_greedy else p.temperature for p in ps])
    top_k = [p.top_k for p in ps]
    if any(top_k):
        meta.top_k = torch.tensor(top_k, device=meta.temperature.device)
        meta.max_top_k = max(top_k)
    meta.top_p = f32([p.top_p for p in ps]) if any(p.top_p < 1.0 for p in ps) else None
    meta.min_p = f32([p.min_p for p in ps]) if any(p.min_p > 0.0 for p in ps) else None
    meta.generators = {i: g for i, r in enumerate(reqs) if (g := gen_for(r)) is not None}
