"""The sampler's per-request state on the device, kept across steps: each request's sampling
parameters in a slot of one table (written on its first sampling step), and for a request with
penalties a row of output-token counts and of its prompt-token mask (built once, then updated
on the device from each step's sampled tokens). Freed when the request is released."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from compiled_llm.core.request import Request
from compiled_llm.sample.uploads import upload

# the columns of the parameter table, in order
TEMPERATURE, TOP_P, MIN_P, TOP_K, PRESENCE, FREQUENCY, REPETITION = range(7)
# slot 0 and penalty row 0: what a neutral row reads (greedy, nothing on, no counts)
_STAND_IN = (0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0)
_EXACT_INT = 1 << 24  # top_k is kept in a float32 column: every int below this is exact


class _Rows:
    """Row numbers 1.. handed out per request id (row 0 is never handed out); doubles its
    capacity when it runs out (the caller grows its tensors by the same count)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.of: dict[str, int] = {}
        self._free = list(range(capacity, 0, -1))

    def take(self, request_id: str) -> tuple[int, int]:
        """(row, rows added to the capacity) for a request that holds none."""
        grown = 0
        if not self._free:
            grown = self.capacity
            self._free = list(range(2 * grown, grown, -1))
            self.capacity *= 2
        row = self.of[request_id] = self._free.pop()
        return row, grown

    def release(self, request_ids: Iterable[str]) -> None:
        """Give back the rows of these requests (unknown ids are ignored)."""
        for request_id in request_ids:
            row = self.of.pop(request_id, None)
            if row is not None:
                self._free.append(row)


def _param_row(req: Request, vocab_size: int | None) -> tuple[float, ...]:
    """A request's row of the parameter table (top_k clamped to the vocabulary: the same cut)."""
    p = req.sampling_params
    if not 0 <= p.top_k < 1 << 63:  # past validation: fail the request, not clamp
        raise ValueError(f"top_k {p.top_k} is outside the int64 range")
    return (0.0 if p.is_greedy else p.temperature, p.top_p, p.min_p,
            min(p.top_k, vocab_size or _EXACT_INT, _EXACT_INT), p.presence_penalty,
            p.frequency_penalty, p.repetition_penalty)


class SamplingState:
    """Device tables indexed by a slot per request: `params` [slots + 1, 7] float32 (columns
    above) and, once some request has penalties, `counts` [rows + 1, V] int32 (its output
    tokens) and `prompt_seen` [rows + 1, V] bool (its prompt tokens, for repetition)."""

    def __init__(self, device: torch.device, vocab_size: int | None, capacity: int = 64) -> None:
        self.device, self.vocab_size = device, vocab_size
        self.slots = _Rows(capacity)
        self.params = self._stand_ins(capacity + 1)
        self.penalty_rows = _Rows(8)
        self.counts: torch.Tensor | None = None
        self.prompt_seen: torch.Tensor | None = None

    def _stand_ins(self, count: int) -> torch.Tensor:
        return upload([_STAND_IN], torch.float32, self.device).expand(count, -1).contiguous()

    @property
    def num_live(self) -> int:
        """Requests holding a parameter slot."""
        return len(self.slots.of)

    def slots_for(self, reqs: list[Request], neutral: set[int]) -> list[int]:
        """Each row's slot (0 for neutral rows); requests seen for the first time get one, with
        their parameters written in one copy. Raises, holding no new slot, on a value the
        table cannot hold."""
        of = self.slots.of
        new = {req.request_id: req for row, req in enumerate(reqs)
               if row not in neutral and req.request_id not in of}
        if new:
            values = [_param_row(req, self.vocab_size) for req in new.values()]
            index = [self._take_slot(request_id) for request_id in new]
            self.params.index_copy_(0, upload(index, torch.int64, self.device),
                                    upload(values, torch.float32, self.device))
        return [0 if row in neutral else of[req.request_id] for row, req in enumerate(reqs)]

    def _take_slot(self, request_id: str) -> int:
        slot, grown = self.slots.take(request_id)
        if grown:
            self.params = torch.cat([self.params, self._stand_ins(grown)])
        return slot

    def penalty_rows_for(self, reqs: list[Request], neutral: set[int]) -> list[int]:
        """Each row's counts row (0 for rows without penalties); a request seen for the first
        time gets one, built from its output tokens and (for repetition) its prompt."""
        of, rows, new = self.penalty_rows.of, [], []
        for i, req in enumerate(reqs):
            p = req.sampling_params
            if i in neutral or not (p.presence_penalty or p.frequency_penalty
                                    or p.repetition_penalty != 1.0):
                rows.append(0)
                continue
            row = of.get(req.request_id)
            if row is None:  # (a request has one sampling row per step)
                row = self._take_penalty_row(req.request_id)
                new.append((row, req))
            rows.append(row)
        if new:
            try:
                self._build_penalty_rows(new)
            except Exception:  # hold no row that was never built
                self.penalty_rows.release(req.request_id for _, req in new)
                raise
        return rows

    def _take_penalty_row(self, request_id: str) -> int:
        if self.counts is None:
            if self.vocab_size is None:
                raise ValueError("penalties need the sampler's vocab_size")
            shape = (self.penalty_rows.capacity + 1, self.vocab_size)
            self.counts = torch.zeros(shape, dtype=torch.int32, device=self.device)
            self.prompt_seen = torch.zeros(shape, dtype=torch.bool, device=self.device)
        row, grown = self.penalty_rows.take(request_id)
        if grown:
            self.counts = torch.cat([self.counts, self.counts.new_zeros(grown, self.vocab_size)])
            self.prompt_seen = torch.cat([self.prompt_seen,
                                          self.prompt_seen.new_zeros(grown, self.vocab_size)])
        return row

    def _build_penalty_rows(self, new: list[tuple[int, Request]]) -> None:
        """Zero the new rows, then count their output tokens and mark their prompt tokens, all
        from one packed copy: [rows | output rows | output ids | prompt rows | prompt ids]."""
        out_rows, out_ids, prompt_rows, prompt_ids = [], [], [], []
        for row, req in new:
            out_rows += [row] * len(req.output_token_ids)
            out_ids += req.output_token_ids
            if req.sampling_params.repetition_penalty != 1.0:
                prompt_rows += [row] * len(req.prompt_token_ids)
                prompt_ids += req.prompt_token_ids
        packed = upload([row for row, _ in new] + out_rows + out_ids + prompt_rows + prompt_ids,
                        torch.int64, self.device)
        n, a, b = len(new), len(out_rows), len(prompt_rows)
        rows = packed[:n]
        self.counts.index_fill_(0, rows, 0)
        self.prompt_seen.index_fill_(0, rows, False)
        if a:
            out_rows_t, out_ids_t = packed[n:n + a], packed[n + a:n + 2 * a]
            ones = torch.ones(a, dtype=torch.int32, device=self.device)
            self.counts.index_put_((out_rows_t, out_ids_t), ones, accumulate=True)
        if b:
            start = n + 2 * a
            prompt_rows_t, prompt_ids_t = packed[start:start + b], packed[start + b:]
            self.prompt_seen[prompt_rows_t, prompt_ids_t] = True

    def add_sampled(self, rows: torch.Tensor, sampled: torch.Tensor) -> None:
        """Count each row's sampled token in its counts row, on the device (row 0, the rows
        without penalties, is left as it is)."""
        self.counts.index_put_((rows, sampled), (rows != 0).to(torch.int32), accumulate=True)

    def release(self, request_ids: Iterable[str]) -> None:
        """Free the slots and counts rows of these requests (unknown ids are ignored)."""
        request_ids = list(request_ids)
        self.slots.release(request_ids)
        self.penalty_rows.release(request_ids)
