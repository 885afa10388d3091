"""Turns a SchedulerOutput into the flat inputs of one forward: ids, positions, slots,
attention metadata, and which hidden rows need logits (sampling and prompt logprobs).

Everything is written in place into the persistent StepBuffers: a Python pass per request for
its scalars and token ids, numpy over the batch for the rest; no per-token Python loops.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain

import numpy as np
import torch

from compiled_llm.attention import AttentionMetadata
from compiled_llm.core.request import Request
from compiled_llm.core.scheduler import SchedulerOutput
from compiled_llm.worker.step_buffers import Layout, StepBuffers

# (num_seqs, num_tokens, max_query_len) -> (decode graph size or None, piecewise tokens or None)
PadFn = Callable[[int, int, int], tuple[int | None, int | None]]


@dataclass
class PromptLogprobRows:
    """Rows of this step's hidden states that score prompt tokens of one request."""

    req: Request
    rows: np.ndarray  # hidden rows
    targets: np.ndarray  # the prompt tokens those rows predict


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [P] (padded rows read token 0 at position 0)
    positions: torch.Tensor  # [P]
    attn: AttentionMetadata
    num_tokens: int  # real rows; the forward's output is cut to these
    sample_rows: torch.Tensor  # [S] device: hidden row per sampling request
    sample_reqs: list[Request]
    prompt_rows: list[PromptLogprobRows] = field(default_factory=list)
    graph_size: int | None = None  # replay the full decode graph of this size
    cudagraph_tokens: int | None = None  # piecewise graphs padded to this many tokens
    # async scheduling: some input_ids are ~row of the previous step's sampled tensor, to be
    # filled on the device (the host has not read those tokens yet)
    has_pending: bool = False

    @property
    def all_rows_sample(self) -> bool:
        """Every hidden row samples, in order (pure decode): no row gather needed."""
        return len(self.sample_reqs) == self.num_tokens


def _prompt_rows(req: Request, pos: np.ndarray, row0: int) -> PromptLogprobRows:
    # row at position p scores token p+1; only tokens not yet scored and still in the prompt
    have = len(req.prompt_logprobs)
    keep = (pos + 1 >= have) & (pos + 1 < req.num_prompt_tokens)
    rows = row0 + np.nonzero(keep)[0]
    targets = np.asarray(req.prompt_token_ids, dtype=np.int64)[pos[keep] + 1]
    return PromptLogprobRows(req, rows, targets)


def build_step_inputs(sched: SchedulerOutput, bufs: StepBuffers, block_size: int,
                      pad: PadFn | None = None) -> StepInputs:
    """Fill the step buffers from the scheduled requests and send them to the device."""
    reqs = [r for r, _ in sched.scheduled]
    counts = [n for _, n in sched.scheduled]
    # [B, 3]: (tokens computed, tokens on the host, tokens pending) per request, one pass
    known = np.array([(r.num_computed_tokens, len(r.all_token_ids), r.num_pending)
                      for r in reqs], np.int64)
    starts = known[:, 0]
    pending = bool(known[:, 2].any())
    b, n = len(reqs), sum(counts)
    decode = n == b  # one new token per request
    max_q = 1 if decode else max(counts)
    graph, tokens = pad(b, n, max_q) if pad is not None else (None, None)
    qsl = _ARANGE[:b + 1] if decode and b < len(_ARANGE) else np.concatenate(
        ([0], np.cumsum(counts)))
    ends = starts + (1 if decode else counts)
    sample = np.flatnonzero(ends == known[:, 1] + known[:, 2])
    bufs.wait()
    rows = np.empty(b, dtype=np.int64)
    entries = bufs.table.update(reqs, rows)
    lay = Layout(graph or tokens or n, graph or b, len(sample), len(entries))
    bufs.check(lay)
    views = bufs.views(lay.tokens, lay.seqs)
    v = views.host(bufs)
    _fill_tokens(v, reqs, starts, counts, qsl, rows, block_size, bufs.table.host, pending)
    _fill_seqs(v, qsl, ends, rows, n)
    a64, a32 = bufs.i64.np, bufs.i32.np
    a64[lay.sample:lay.sample + len(sample)] = qsl[1:][sample] - 1
    if len(entries):
        a64[lay.entry_idx:lay.end64] = entries
        a32[lay.entry_val:lay.end32] = bufs.table.host.reshape(-1)[entries]
    bufs.send(lay, views)
    attn = attention_metadata(views, n, b, max_q, int(ends.max()), block_size)
    prompt = [_prompt_rows(r, np.arange(s, s + c), int(q))
              for r, s, c, q in zip(reqs, starts, counts, qsl) if r.needs_prompt_logprobs]
    d = views.dev
    sample_reqs = reqs if len(sample) == b else [reqs[i] for i in sample]
    return StepInputs(d["ids"], d["pos"], attn, n,
                      bufs.i64.dev[lay.sample:lay.sample + len(sample)],
                      sample_reqs, prompt, graph, tokens if graph is None else None, pending)


_ARANGE = np.arange(4097, dtype=np.int64)  # query starts of a pure-decode batch


def attention_metadata(views, n: int, b: int, max_q: int, max_len: int,
                       block_size: int) -> AttentionMetadata:
    """Metadata over the buffer views of a step: its n real tokens and b real sequences."""
    d, h = views.dev, views.host32
    width = -(-max_len // block_size)
    cut = n < len(d["slots"]) or b < len(d["seq_lens"])  # padded: show the real rows only
    return AttentionMetadata(
        slot_mapping=d["slots"][:n] if cut else d["slots"],
        query_start_loc=d["qsl"][:b + 1] if cut else d["qsl"],
        seq_lens=d["seq_lens"][:b] if cut else d["seq_lens"],
        block_tables=d["block_tables"][:b, :width],
        num_actual_tokens=n, max_query_len=max_q, max_seq_len=max_len,
        query_start_loc_cpu=h["qsl"][:b + 1] if cut else h["qsl"],
        seq_lens_cpu=h["seq_lens"][:b] if cut else h["seq_lens"])


def _fill_tokens(v: dict, reqs: list[Request], starts: np.ndarray, counts: list[int],
                 qsl: np.ndarray, rows: np.ndarray, block_size: int, table: np.ndarray,
                 pending: bool = False) -> None:
    """ids, positions and slots of the real rows; padded rows read token 0 at position 0 and
    write the null slot 0. Pending tokens (async scheduling) are written as ~row."""
    n, decode = int(qsl[-1]), len(reqs) == int(qsl[-1])
    ids, pos, slots = v["ids"], v["pos"], v["slots"]
    if decode:
        ids[:n] = ([_token(r, s) for r, s in zip(reqs, starts.tolist())] if pending else
                   [r.all_token_ids[s] for r, s in zip(reqs, starts.tolist())])
        pos[:n] = starts
        tok_rows = rows
    else:  # position = start of its request + offset within the request's chunk
        chunks = _chunk_with_pending if pending else _chunk
        ids[:n] = np.fromiter(chain.from_iterable(
            chunks(r, s, c) for r, s, c in zip(reqs, starts.tolist(), counts)), np.int64, n)
        pos[:n] = np.arange(n) + np.repeat(starts - qsl[:-1], counts)
        tok_rows = np.repeat(rows, counts)
    p = pos[:n]
    slots[:n] = table[tok_rows, p // block_size].astype(np.int64) * block_size + p % block_size
    ids[n:] = 0
    pos[n:] = 0
    slots[n:] = 0


def _token(r: Request, i: int) -> int:
    """Token i of r, or ~(its row in the previous step's sampled tensor) while pending."""
    return r.all_token_ids[i] if i < len(r.all_token_ids) else ~r.pending_src


def _chunk(r: Request, start: int, count: int) -> list[int]:
    return r.all_token_ids[start:start + count]


def _chunk_with_pending(r: Request, start: int, count: int) -> list[int]:
    ids = r.all_token_ids[start:start + count]
    return ids + [~r.pending_src] * (count - len(ids))  # at most the one pending token


def _fill_seqs(v: dict, qsl: np.ndarray, ends: np.ndarray, rows: np.ndarray, n: int) -> None:
    """Per-sequence segments; padded sequences hold one token of context in the null row."""
    b = len(rows)
    seqs = len(v["rows"])
    v["qsl"][:b + 1] = qsl
    v["qsl"][b + 1:] = np.arange(n + 1, n + 1 + seqs - b)
    v["seq_lens"][:b] = ends
    v["seq_lens"][b:] = 1
    v["rows"][:b] = rows
    v["rows"][b:] = 0


def fill_padding(bufs: StepBuffers, size: int) -> None:
    """Fill and send a step of `size` padding rows only (valid inputs for graph capture)."""
    lay = Layout(size, size)
    bufs.wait()
    views = bufs.views(size, size)
    v = views.host(bufs)
    for name in ("ids", "pos", "slots"):
        v[name][:] = 0
    _fill_seqs(v, np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64),
               np.zeros(0, dtype=np.int64), 0)
    bufs.send(lay, views)
