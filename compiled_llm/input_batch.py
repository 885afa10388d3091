"""Turns a SchedulerOutput into the flat tensors of one forward: ids, positions, slots,
attention metadata, and which hidden rows need logits (sampling and prompt logprobs).

Host-side numpy work per request; no per-token Python loops.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from compiled_llm.attention import AttentionMetadata
from compiled_llm.request import Request
from compiled_llm.scheduler import SchedulerOutput


@dataclass
class PromptLogprobRows:
    """Rows of this step's hidden states that score prompt tokens of one request."""

    req: Request
    rows: np.ndarray  # hidden rows
    targets: np.ndarray  # the prompt tokens those rows predict


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    attn: AttentionMetadata
    sample_rows: list[int]  # hidden row per sampling request
    sample_reqs: list[Request]
    prompt_rows: list[PromptLogprobRows] = field(default_factory=list)


def _request_slots(req: Request, pos: np.ndarray, block_size: int) -> np.ndarray:
    blocks = np.asarray(req.block_ids, dtype=np.int64)
    return blocks[pos // block_size] * block_size + pos % block_size


def _prompt_rows(req: Request, start: int, pos: np.ndarray, row0: int) -> PromptLogprobRows:
    # row at position p scores token p+1; only tokens not yet scored and still in the prompt
    have = len(req.prompt_logprobs)
    keep = (pos + 1 >= have) & (pos + 1 < req.num_prompt_tokens)
    rows = row0 + np.nonzero(keep)[0]
    targets = np.asarray(req.prompt_token_ids, dtype=np.int64)[pos[keep] + 1]
    return PromptLogprobRows(req, rows, targets)


def build_step_inputs(sched: SchedulerOutput, block_size: int, device: torch.device) -> StepInputs:
    """Flatten the scheduled requests into one token batch with its attention metadata."""
    ids, pos_list, slots, lens = [], [], [], []
    qsl = [0]
    sample_rows, sample_reqs, prompt_rows = [], [], []
    for req, n in sched.scheduled:
        start = req.num_computed_tokens
        pos = np.arange(start, start + n, dtype=np.int64)
        ids.append(np.asarray(req.all_token_ids[start : start + n], dtype=np.int64))
        pos_list.append(pos)
        slots.append(_request_slots(req, pos, block_size))
        row0 = qsl[-1]
        qsl.append(row0 + n)
        lens.append(start + n)
        if req.needs_prompt_logprobs:
            prompt_rows.append(_prompt_rows(req, start, pos, row0))
        if start + n == req.num_tokens:
            sample_rows.append(row0 + n - 1)
            sample_reqs.append(req)
    width = max(len(r.block_ids) for r, _ in sched.scheduled)
    table = np.zeros((len(lens), width), dtype=np.int32)
    for i, (req, _) in enumerate(sched.scheduled):
        table[i, : len(req.block_ids)] = req.block_ids
    attn = _metadata(np.concatenate(slots), qsl, lens, table, device)
    to_dev = lambda a: torch.from_numpy(np.concatenate(a)).to(device, non_blocking=True)  # noqa: E731
    return StepInputs(to_dev(ids), to_dev(pos_list), attn, sample_rows, sample_reqs, prompt_rows)


def _metadata(slots, qsl, lens, table, device) -> AttentionMetadata:
    qsl_t = torch.tensor(qsl, dtype=torch.int32)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    return AttentionMetadata(
        slot_mapping=torch.from_numpy(slots).to(device, non_blocking=True),
        query_start_loc=qsl_t.to(device, non_blocking=True),
        seq_lens=lens_t.to(device, non_blocking=True),
        block_tables=torch.from_numpy(table).to(device, non_blocking=True),
        num_actual_tokens=qsl[-1],
        max_query_len=max(b - a for a, b in zip(qsl, qsl[1:])),
        max_seq_len=max(lens),
        query_start_loc_cpu=qsl_t,
        seq_lens_cpu=lens_t,
    )
