"""The input batch: turns a SchedulerOutput into the flat inputs of one forward (ids,
positions, slots, attention metadata, which hidden rows need logits), padded to the CUDA graph
the dispatcher picks, in persistent buffers sized once (see step_buffers.py).

A Python pass per request for its scalars and token ids, numpy over the batch for the rest;
no per-token Python loops. `prepare` fills a step, `pad` a step of padding rows only (graph
capture), `release` gives finished or preempted requests' block-table rows back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain

import numpy as np
import torch

from compiled_llm.attention import AttentionMetadata
from compiled_llm.attention.forward_context import CUDAGraphKey
from compiled_llm.core.request import Request
from compiled_llm.core.scheduler import SchedulerOutput
from compiled_llm.worker.cudagraph import FULL, CUDAGraphDispatcher
from compiled_llm.worker.step_buffers import BlockTableRows, Layout, PackedBuffer, Views


@dataclass
class PromptLogprobRows:
    """Rows of this step's hidden states that score prompt tokens of one request."""

    req: Request
    rows: np.ndarray  # hidden rows
    targets: np.ndarray  # the prompt tokens those rows predict


@dataclass
class StepInputs:
    """One step's device inputs (views of the input batch's buffers) and its row maps."""

    input_ids: torch.Tensor  # [P] (padded rows read token 0 at position 0)
    positions: torch.Tensor  # [P]
    attn: AttentionMetadata
    num_tokens: int  # real rows; the forward's output is cut to these
    sample_rows: torch.Tensor  # [S] device: hidden row per sampling request
    sample_reqs: list[Request]
    prompt_rows: list[PromptLogprobRows] = field(default_factory=list)
    cudagraph_key: CUDAGraphKey | None = None  # the graph the step runs under (padded to)
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


class InputBatch:
    """Every persistent tensor one step's inputs live in, and the fill of one step. Owned by
    the model runner; the dispatcher (shared with it) decides each step's padding."""

    def __init__(self, max_tokens: int, max_seqs: int, max_blocks: int, block_size: int,
                 device: torch.device, dispatcher: CUDAGraphDispatcher | None = None) -> None:
        self.max_tokens, self.max_seqs, self.device = max_tokens, max_seqs, device
        self.block_size = block_size
        self.dispatcher = dispatcher or CUDAGraphDispatcher()
        cap = Layout(max_tokens, max_seqs, max_seqs, max_seqs * max_blocks)
        self.i64 = PackedBuffer(cap.end64, torch.int64, device)
        self.i32 = PackedBuffer(cap.end32, torch.int32, device)
        self.table = BlockTableRows(max_seqs, max_blocks, device)
        self.batch_table = torch.zeros(max_seqs, max_blocks, dtype=torch.int32, device=device)
        self._event = torch.cuda.Event() if device.type == "cuda" else None
        self._in_flight = False
        self._views: dict[tuple[int, int], Views] = {}

    def prepare(self, sched: SchedulerOutput) -> StepInputs:
        """Fill the buffers from the scheduled requests (padded to the dispatched graph) and
        send them to the device."""
        reqs = [r for r, _ in sched.scheduled]
        counts = [n for _, n in sched.scheduled]
        # [B, 3]: (tokens computed, tokens on the host, tokens pending) per request, one pass
        known = np.array([(r.num_computed_tokens, len(r.all_token_ids), r.num_pending)
                          for r in reqs], np.int64)
        starts = known[:, 0]
        pending = bool(known[:, 2].any())
        num_seqs, num_tokens = len(reqs), sum(counts)
        decode = num_tokens == num_seqs  # one new token per request
        max_query_len = 1 if decode else max(counts)
        key = self.dispatcher.dispatch(num_seqs, num_tokens, max_query_len)
        query_starts = _ARANGE[:num_seqs + 1] if decode and num_seqs < len(_ARANGE) else \
            np.concatenate(([0], np.cumsum(counts)))
        ends = starts + (1 if decode else counts)
        sample = np.flatnonzero(ends == known[:, 1] + known[:, 2])
        self.wait()
        rows = np.empty(num_seqs, dtype=np.int64)
        entries = self.table.update(reqs, rows)
        padded_tokens = num_tokens if key is None else key.num_tokens
        padded_seqs = key.num_tokens if key is not None and key.mode == FULL else num_seqs
        layout = Layout(padded_tokens, padded_seqs, len(sample), len(entries))
        self.check(layout)
        views = self.views(layout.tokens, layout.seqs)
        host = views.host(self)
        _fill_tokens(host, reqs, starts, counts, query_starts, rows, self.block_size,
                     self.table.host, pending)
        _fill_seqs(host, query_starts, ends, rows, num_tokens)
        self._fill_sample_and_entries(layout, query_starts[1:][sample], entries)
        self.send(layout, views)
        attn = attention_metadata(views, num_tokens, num_seqs, max_query_len, int(ends.max()),
                                  self.block_size)
        prompt = [_prompt_rows(r, np.arange(s, s + c), int(q)) for r, s, c, q
                  in zip(reqs, starts, counts, query_starts) if r.needs_prompt_logprobs]
        dev = views.dev
        sample_reqs = reqs if len(sample) == num_seqs else [reqs[i] for i in sample]
        sample_rows = self.i64.dev[layout.sample:layout.sample + len(sample)]
        return StepInputs(dev["ids"], dev["pos"], attn, num_tokens, sample_rows, sample_reqs,
                          prompt, key, pending)

    def _fill_sample_and_entries(self, layout: Layout, sample_ends: np.ndarray,
                                 entries: np.ndarray) -> None:
        """The hidden row of each sampling request (its last token) and the new table entries."""
        int64s, int32s = self.i64.np, self.i32.np
        int64s[layout.sample:layout.sample + len(sample_ends)] = sample_ends - 1
        if len(entries):
            int64s[layout.entry_idx:layout.end64] = entries
            int32s[layout.entry_val:layout.end32] = self.table.host.reshape(-1)[entries]

    def pad(self, size: int) -> None:
        """Fill and send a step of `size` padding rows only (valid inputs for graph capture:
        null slot, one token of context, the zero table row)."""
        layout = Layout(size, size)
        self.wait()
        views = self.views(size, size)
        host = views.host(self)
        for name in ("ids", "pos", "slots"):
            host[name][:] = 0
        empty = np.zeros(0, dtype=np.int64)
        _fill_seqs(host, np.zeros(1, dtype=np.int64), empty, empty, 0)
        self.send(layout, views)

    def padded_inputs(self, size: int, max_len: int) -> tuple[torch.Tensor, torch.Tensor,
                                                              AttentionMetadata]:
        """ids, positions and metadata over the views a full graph of `size` reads."""
        views = self.views(size, size)
        meta = attention_metadata(views, size, size, 1, max_len, self.block_size)
        return views.dev["ids"], views.dev["pos"], meta

    def release(self, finished: set[str], preempted: set[str] = frozenset()) -> None:
        """Give back the table rows of finished and preempted requests (a preempted request
        resumes with a new block list, so a new row)."""
        self.table.release(finished)
        self.table.release(preempted)

    def check(self, layout: Layout) -> None:
        """ValueError when a step would overflow the buffers."""
        if layout.tokens > self.max_tokens or layout.seqs > self.max_seqs:
            raise ValueError(f"step of {layout.tokens} tokens / {layout.seqs} sequences exceeds "
                             f"the buffers ({self.max_tokens} / {self.max_seqs})")

    def wait(self) -> None:
        """Block until the previous step's copies have read the host buffers (normally done:
        the previous step's sampled tokens were already read back)."""
        if self._in_flight:
            self._event.synchronize()
            self._in_flight = False

    def views(self, tokens: int, seqs: int) -> Views:
        """The (cached) views of a step shape."""
        views = self._views.get((tokens, seqs))
        if views is None:
            if len(self._views) >= 1024:  # prefill shapes vary: keep the cache bounded
                self._views.clear()
            views = self._views[tokens, seqs] = Views(self, tokens, seqs)
        return views

    def send(self, layout: Layout, views: Views) -> None:
        """Copy the step's packed inputs, write new table entries, gather the step's rows."""
        self.i64.send(layout.end64)
        self.i32.send(layout.end32)
        if self._event is not None:
            self._event.record()
            self._in_flight = True
        if layout.num_entries:
            idx = self.i64.dev[layout.entry_idx:layout.end64]
            vals = self.i32.dev[layout.entry_val:layout.end32]
            self.table.device.view(-1).index_copy_(0, idx, vals)
        torch.index_select(self.table.device, 0, views.dev["rows"],
                           out=views.dev["block_tables"])


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
