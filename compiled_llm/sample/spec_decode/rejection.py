"""Verification of drafts: greedy rows accept drafts while they equal the target's argmax;
sampled rows use rejection sampling (accept draft x with probability min(1, p(x)/q(x)), else
draw from the normalised max(0, p - q); after k accepts a bonus draw from p), so output follows
the target's distribution (p as the sampler makes it; q one-hot for a deterministic proposer).
Seeded requests draw all their randomness from their own generator."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from compiled_llm.sample.metadata import SamplingMetadata
from compiled_llm.sample.sampler import Sampler

_TINY = torch.finfo(torch.float32).tiny


@dataclass
class VerifyBatch:
    """The verify rows of one step: request i owns rows [offsets[i], offsets[i] + n_i] (its
    n_i drafts, then the bonus row), in logits and meta alike."""

    drafts: list[list[int]]
    draft_probs: list[torch.Tensor | None]  # per request [n_i, V], None for one-hot drafts
    offsets: list[int]

    @staticmethod
    def of(drafts: list[list[int]], draft_probs: list[torch.Tensor | None]) -> VerifyBatch:
        """The batch of these requests' drafts, rows laid out request after request."""
        offsets, row = [], 0
        for tokens in drafts:
            offsets.append(row)
            row += len(tokens) + 1
        return VerifyBatch(drafts, draft_probs, offsets)

    @property
    def draft_rows(self) -> list[int]:
        """The logits row of every draft token, flat."""
        return [start + j for start, tokens in zip(self.offsets, self.drafts)
                for j in range(len(tokens))]


def verify(logits: torch.Tensor, meta: SamplingMetadata, batch: VerifyBatch) -> list[list[int]]:
    """Per request: its accepted drafts, then one token from the target (the recovered draw
    at the first rejection, or the bonus draw). logits [R, V] are not edited."""
    device = logits.device
    logits = Sampler.process_logits(logits.to(torch.float32, copy=True), meta)
    greedy = logits.argmax(dim=-1)
    flat = [token for tokens in batch.drafts for token in tokens]
    rows = torch.tensor(batch.draft_rows, dtype=torch.int64).to(device, non_blocking=True)
    draft_ids = torch.tensor(flat, dtype=torch.int64).to(device, non_blocking=True)
    accept = greedy.index_select(0, rows) == draft_ids
    final = greedy
    if not meta.all_greedy:
        probs, is_greedy = Sampler.probs(logits, meta)
        sampled_accept, recovered = _rejection_sample(probs, batch, rows, draft_ids,
                                                      _generators(meta, batch))
        accept = torch.where(is_greedy.index_select(0, rows), accept, sampled_accept)
        final = torch.where(is_greedy, greedy, recovered)
    accepted, tokens = accept.tolist(), final.tolist()
    out, pos = [], 0
    for start, drafts in zip(batch.offsets, batch.drafts):
        num = 0
        while num < len(drafts) and accepted[pos + num]:
            num += 1
        pos += len(drafts)
        out.append(drafts[:num] + [tokens[start + num]])
    return out


def _generators(meta: SamplingMetadata, batch: VerifyBatch) -> dict[int, torch.Generator]:
    """Request index -> its seeded generator (a request's rows share one)."""
    return {i: meta.generators[start] for i, start in enumerate(batch.offsets)
            if start in meta.generators}


def _rejection_sample(probs: torch.Tensor, batch: VerifyBatch, rows: torch.Tensor,
                      draft_ids: torch.Tensor, generators: dict[int, torch.Generator]
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(accept [D] per draft, a draw per row [R] from max(0, p - q), p on bonus rows)."""
    q = torch.zeros_like(probs)
    q[rows, draft_ids] = 1.0  # one-hot drafts; a draft model's rows are overwritten below
    for start, drafts, draft_q in zip(batch.offsets, batch.drafts, batch.draft_probs):
        if draft_q is not None:
            q[start:start + len(drafts)] = draft_q[:len(drafts)]
    uniform = torch.rand(len(draft_ids), device=probs.device)
    noise = torch.empty_like(probs).exponential_()
    pos = 0
    for i, (start, drafts) in enumerate(zip(batch.offsets, batch.drafts)):
        gen = generators.get(i)
        if gen is not None:  # the request's own stream: independent of the batch
            uniform[pos:pos + len(drafts)] = torch.rand(len(drafts), generator=gen,
                                                        device=probs.device)
            noise[start:start + len(drafts) + 1].exponential_(generator=gen)
        pos += len(drafts)
    p_draft, q_draft = probs[rows, draft_ids], q[rows, draft_ids]
    accept = uniform * q_draft < p_draft  # u < min(1, p/q), q > 0 for a drawn draft
    residual = (probs - q).clamp_(min=0.0)
    empty = residual.sum(dim=-1, keepdim=True) <= 0  # p == q: acceptance was certain
    residual = torch.where(empty, probs, residual)
    recovered = residual.div_(noise.clamp_(min=_TINY)).argmax(dim=-1)
    return accept, recovered
