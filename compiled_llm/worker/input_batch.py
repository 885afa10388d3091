"""The input batch: a SchedulerOutput as the flat inputs of one forward (ids, positions, slots,
attention metadata, the hidden rows that need logits), padded to the dispatched CUDA graph, in
persistent buffers (step_buffers.py). A Python pass per request, numpy over the batch, no
per-token loops. `prepare` fills a step (a request whose data cannot run is left out, named in
`skipped`), `pad` a step of padding rows only (capture), `release` frees table rows.
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
from compiled_llm.worker.step_buffers import (
    BlockTableRows,
    Layout,
    PackedBuffer,
    Views,
    table_width,
)


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
    # requests of the schedule left out of this step, and why (their data cannot run)
    skipped: dict[str, str] = field(default_factory=dict)
    calibrate_kv: bool = False  # the step that calibrates FP8 KV scales (every rank alike)

    @property
    def all_rows_sample(self) -> bool:
        """Every hidden row samples, in order (pure decode): no row gather needed."""
        return len(self.sample_reqs) == self.num_tokens


def _prompt_rows(req: Request, positions: np.ndarray, first_row: int) -> PromptLogprobRows:
    # the row at position i scores token i+1; only tokens not yet scored and still in the prompt
    scored = len(req.prompt_logprobs)
    keep = (positions + 1 >= scored) & (positions + 1 < req.num_prompt_tokens)
    rows = first_row + np.nonzero(keep)[0]
    targets = np.asarray(req.prompt_token_ids, dtype=np.int64)[positions[keep] + 1]
    return PromptLogprobRows(req, rows, targets)


class _BadRows(Exception):
    """Rows of a schedule (by index) whose own data cannot run, and why."""

    def __init__(self, errors: dict[int, str]) -> None:
        super().__init__(errors)
        self.errors = errors


class InputBatch:
    """Every persistent tensor one step's inputs live in, and the fill of one step. Owned by
    the model runner; the dispatcher (shared with it) decides each step's padding. Invariant:
    a step it fills indexes no block-table slot and no token id out of range."""

    def __init__(self, max_tokens: int, max_seqs: int, max_blocks: int, block_size: int,
                 device: torch.device, dispatcher: CUDAGraphDispatcher | None = None,
                 vocab_size: int | None = None) -> None:
        self.max_tokens, self.max_seqs, self.device = max_tokens, max_seqs, device
        self.block_size, self.max_blocks, self.vocab_size = block_size, max_blocks, vocab_size
        self.dispatcher = dispatcher or CUDAGraphDispatcher()
        capacity = Layout(max_tokens, max_seqs, max_seqs, max_seqs * max_blocks)
        self.packed64 = PackedBuffer(capacity.end64, torch.int64, device)
        self.packed32 = PackedBuffer(capacity.end32, torch.int32, device)
        self.table = BlockTableRows(max_seqs, max_blocks, device)
        self.batch_table = torch.zeros(max_seqs, max_blocks, dtype=torch.int32, device=device)
        self.table_width = 0  # block-table columns the last step gathered (all it sends)
        self._event = torch.cuda.Event() if device.type == "cuda" else None
        self._in_flight = False
        self._views: dict[tuple[int, int], Views] = {}
        # LongRoPE's long rows start here in the model's table (0: none, positions as they are)
        self.long_rows_start = 0

    def prepare(self, sched: SchedulerOutput) -> StepInputs:
        """Fill the buffers from the scheduled requests (padded to the dispatched graph) and
        send them to the device. A request whose own data cannot run (tokens past the blocks
        it holds, an id outside the vocabulary) is left out and named in `skipped`; ValueError
        when no request is left."""
        skipped: dict[str, str] = {}
        while True:
            try:
                inputs = self._prepare(sched)
            except _BadRows as bad:
                self.table.unsent(req.request_id for req, _ in sched.scheduled)
                skipped.update({sched.scheduled[i][0].request_id: error
                                for i, error in bad.errors.items()})
                left = [item for i, item in enumerate(sched.scheduled) if i not in bad.errors]
                if not left:
                    raise ValueError(f"no request of the step can run: {skipped}") from None
                sched = SchedulerOutput(left, sched.finished_req_ids, sched.preempted_req_ids)
                continue
            inputs.skipped = skipped
            return inputs

    def _prepare(self, sched: SchedulerOutput) -> StepInputs:
        reqs = [req for req, _ in sched.scheduled]
        counts = [num_new for _, num_new in sched.scheduled]
        # [B, 4]: (tokens computed, on the host, pending, blocks held) per request, one pass
        known = _known(reqs)
        self._check_fit(known, counts)
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
        full = key is not None and key.mode == FULL
        pad_len = key.query_len if full else 1  # tokens of each padding sequence
        padded_seqs = key.num_tokens // pad_len if full else num_seqs
        layout = Layout(padded_tokens, padded_seqs, len(sample), len(entries))
        self.check(layout)
        views = self.views(layout.tokens, layout.seqs)
        host = views.host(self)
        _fill_tokens(host, reqs, starts, counts, query_starts, rows, self.block_size,
                     self.table.host, pending)
        if self.long_rows_start:
            _offset_long_rope(host["pos"], reqs, counts, self.long_rows_start)
        self._check_ids(host["ids"][:num_tokens], query_starts, pending)
        _fill_seqs(host, query_starts, ends, rows, num_tokens, pad_len)
        self._fill_sample_and_entries(layout, query_starts[1:][sample], entries)
        max_seq_len = int(ends.max())
        self.send(layout, views, -(-max_seq_len // self.block_size))
        attn = attention_metadata(views, num_tokens, num_seqs, max_query_len, max_seq_len,
                                  self.block_size)
        prompt = [_prompt_rows(req, np.arange(start, start + count), int(first_row))
                  for req, start, count, first_row in zip(reqs, starts, counts, query_starts)
                  if req.needs_prompt_logprobs]
        sample_reqs = reqs if len(sample) == num_seqs else [reqs[i] for i in sample]
        sample_rows = self.packed64.dev[layout.sample:layout.sample + len(sample)]
        return StepInputs(views.dev["ids"], views.dev["pos"], attn, num_tokens, sample_rows,
                          sample_reqs, prompt, key, pending)

    def _check_fit(self, known: np.ndarray, counts: list[int]) -> None:
        """_BadRows for requests that compute no token, or tokens past the blocks they hold
        or past a block-table row."""
        news, blocks = np.asarray(counts, np.int64), known[:, 3]
        unfit = ((news < 1) | (blocks > self.max_blocks)
                 | (known[:, 0] + news > blocks * self.block_size))
        if unfit.any():
            raise _BadRows({int(i): "input batch: the request's tokens do not fit the KV "
                            "blocks it holds" for i in np.flatnonzero(unfit)})

    def _check_ids(self, ids: np.ndarray, query_starts: np.ndarray, pending: bool) -> None:
        """_BadRows for requests with a token id outside the vocabulary (pending ids, ~row
        of the previous step's tokens, are negative by design)."""
        if self.vocab_size is None or not len(ids):
            return
        if ids.max() < self.vocab_size and (pending or ids.min() >= 0):
            return
        bad = (ids >= self.vocab_size) | (False if pending else ids < 0)
        rows = np.searchsorted(query_starts, np.flatnonzero(bad), side="right") - 1
        raise _BadRows({int(i): f"input batch: token ids outside the vocabulary "
                        f"[0, {self.vocab_size})" for i in np.unique(rows)})

    def _fill_sample_and_entries(self, layout: Layout, sample_ends: np.ndarray,
                                 entries: np.ndarray) -> None:
        """The hidden row of each sampling request (its last token) and the new table entries."""
        int64s, int32s = self.packed64.host_np, self.packed32.host_np
        int64s[layout.sample:layout.sample + len(sample_ends)] = sample_ends - 1
        if len(entries):
            int64s[layout.entry_idx:layout.end64] = entries
            int32s[layout.entry_val:layout.end32] = self.table.host.reshape(-1)[entries]

    def pad(self, size: int, query_len: int = 1) -> None:
        """Fill and send a step of `size` padding sequences of query_len tokens only (valid
        inputs for graph capture: null slot, query_len tokens of context, the zero table
        row)."""
        layout = Layout(size * query_len, size)
        self.wait()
        views = self.views(layout.tokens, size)
        host = views.host(self)
        for name in ("ids", "pos", "slots"):
            host[name][:] = 0
        empty = np.zeros(0, dtype=np.int64)
        _fill_seqs(host, np.zeros(1, dtype=np.int64), empty, empty, 0, query_len)
        self.send(layout, views, -(-query_len // self.block_size))

    def padded_inputs(self, size: int, max_len: int, query_len: int = 1
                      ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """ids, positions and metadata over the views a full graph of `size` sequences of
        query_len tokens reads."""
        views = self.views(size * query_len, size)
        meta = attention_metadata(views, size * query_len, size, query_len, max_len,
                                  self.block_size)
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

    def send(self, layout: Layout, views: Views, width: int) -> None:
        """Copy the step's packed inputs, write new table entries, gather the step's rows:
        the columns of the longest sequence's `width` blocks only (rounded up by table_width),
        so a step's table work does not grow with max_model_len. Columns past those keep stale
        block ids of earlier steps: attention reads no block past a sequence's length, and a
        full graph captured at the whole width reads the same rows at the same addresses."""
        self.packed64.send(layout.end64)
        self.packed32.send(layout.end32)
        if self._event is not None:
            self._event.record()
            self._in_flight = True
        if layout.num_entries:
            entry_index = self.packed64.dev[layout.entry_idx:layout.end64]
            entry_values = self.packed32.dev[layout.entry_val:layout.end32]
            self.table.device.view(-1).index_copy_(0, entry_index, entry_values)
        width = table_width(width, self.max_blocks)
        self.table_width = width
        torch.index_select(self.table.columns(width), 0, views.dev["rows"],
                           out=views.table_columns(width))


_ARANGE = np.arange(4097, dtype=np.int64)  # query starts of a pure-decode batch


def attention_metadata(views: Views, num_tokens: int, num_seqs: int, max_query_len: int,
                       max_seq_len: int, block_size: int) -> AttentionMetadata:
    """Metadata over the buffer views of a step: its num_tokens real tokens and num_seqs real
    sequences."""
    dev, host = views.dev, views.host32
    width = -(-max_seq_len // block_size)
    # padded: show the real rows only
    cut = num_tokens < len(dev["slots"]) or num_seqs < len(dev["seq_lens"])
    query_start_loc, seq_lens = dev["query_start_loc"], dev["seq_lens"]
    query_start_loc_cpu, seq_lens_cpu = host["query_start_loc"], host["seq_lens"]
    order = dev["order"][:num_seqs] if cut else dev["order"]
    return AttentionMetadata(
        slot_mapping=dev["slots"][:num_tokens] if cut else dev["slots"],
        query_start_loc=query_start_loc[:num_seqs + 1] if cut else query_start_loc,
        seq_lens=seq_lens[:num_seqs] if cut else seq_lens,
        block_tables=dev["block_tables"][:num_seqs, :width],
        num_actual_tokens=num_tokens, max_query_len=max_query_len, max_seq_len=max_seq_len,
        query_start_loc_cpu=query_start_loc_cpu[:num_seqs + 1] if cut else query_start_loc_cpu,
        seq_lens_cpu=seq_lens_cpu[:num_seqs] if cut else seq_lens_cpu, decode_order=order)


def _fill_tokens(host: dict, reqs: list[Request], starts: np.ndarray, counts: list[int],
                 query_starts: np.ndarray, rows: np.ndarray, block_size: int, table: np.ndarray,
                 pending: bool = False) -> None:
    """ids, positions and slots of the real rows; padded rows read token 0 at position 0 and
    write the null slot 0. Pending tokens (async scheduling) are written as ~row."""
    num_tokens = int(query_starts[-1])
    decode = len(reqs) == num_tokens
    ids, pos, slots = host["ids"], host["pos"], host["slots"]
    if decode:
        ids[:num_tokens] = (
            # a pending token is ~(its row in the previous step's sampled tensor); inlined (hot)
            [r.all_token_ids[s] if s < len(r.all_token_ids) else ~r.pending_src
             for r, s in zip(reqs, starts.tolist())] if pending else
            [r.all_token_ids[s] for r, s in zip(reqs, starts.tolist())])
        pos[:num_tokens] = starts
        token_rows = rows
    else:  # position = start of its request + offset within the request's chunk
        chunks = _chunk_with_pending if pending else _chunk
        ids[:num_tokens] = np.fromiter(chain.from_iterable(
            chunks(req, start, count) for req, start, count in zip(reqs, starts.tolist(), counts)),
            np.int64, num_tokens)
        pos[:num_tokens] = np.arange(num_tokens) + np.repeat(starts - query_starts[:-1], counts)
        token_rows = np.repeat(rows, counts)
    real_pos = pos[:num_tokens]
    blocks = table[token_rows, real_pos // block_size].astype(np.int64)
    slots[:num_tokens] = blocks * block_size + real_pos % block_size
    ids[num_tokens:] = 0
    pos[num_tokens:] = 0
    slots[num_tokens:] = 0


def _offset_long_rope(pos: np.ndarray, reqs: list[Request], counts: list[int],
                      long_rows_start: int) -> None:
    """The tokens of requests whose prompts passed LongRoPE's original length read the
    table's long rows (slots were made from the plain positions already)."""
    long = np.fromiter((req.long_rope for req in reqs), bool, len(reqs))
    if long.any():
        pos[:sum(counts)] += long_rows_start * np.repeat(long, counts)


def _known(reqs: list[Request]) -> np.ndarray:
    """[B, 4] int64: (tokens computed, on the host, pending, blocks held) per request."""
    flat: list[int] = []
    add = flat.extend
    for req in reqs:
        add((req.num_computed_tokens, len(req.all_token_ids), req.num_pending,
             len(req.block_ids)))
    # one flat list converts about twice as fast as a list of tuples (hot: every step)
    return np.array(flat, np.int64).reshape(len(reqs), 4)


def _chunk(req: Request, start: int, count: int) -> list[int]:
    ids = req.all_token_ids[start:start + count]
    # speculative decoding: a verify step's query runs on past the known tokens into the drafts
    return ids if len(ids) == count else ids + req.spec_token_ids[:count - len(ids)]


def _chunk_with_pending(req: Request, start: int, count: int) -> list[int]:
    ids = req.all_token_ids[start:start + count]
    return ids + [~req.pending_src] * (count - len(ids))  # at most the one pending token


def _fill_seqs(host: dict, query_starts: np.ndarray, ends: np.ndarray, rows: np.ndarray,
               num_tokens: int, pad_len: int = 1) -> None:
    """Per-sequence segments; padded sequences hold pad_len tokens (all of their context) in
    the null row."""
    num_seqs, padded_seqs = len(rows), len(host["rows"])
    host["query_start_loc"][:num_seqs + 1] = query_starts
    host["query_start_loc"][num_seqs + 1:] = num_tokens + pad_len * np.arange(
        1, 1 + padded_seqs - num_seqs)
    host["seq_lens"][:num_seqs] = ends
    host["seq_lens"][num_seqs:] = pad_len
    host["rows"][:num_seqs] = rows
    host["rows"][num_seqs:] = 0
    _fill_order(host["order"], host["seq_lens"], host["query_start_loc"],
                num_tokens == num_seqs and pad_len == 1)


def _fill_order(order: np.ndarray, seq_lens: np.ndarray, query_starts: np.ndarray,
                decode: bool) -> None:
    """AttentionMetadata.decode_order: the leading one-token sequences by context, longest
    first (a stable sort: padding, one token each, after the real ones), then the rest in
    place. Launched in that order, a decode's longest programs no longer end it alone: over
    contexts of 100-2,048 tokens that tail was most of the gap to a uniform batch's speed."""
    leading = len(order)
    if not decode:
        longer = np.flatnonzero(np.diff(query_starts) != 1)
        leading = int(longer[0]) if len(longer) else leading
    order[:leading] = np.argsort(-seq_lens[:leading], kind="stable")
    order[leading:] = np.arange(leading, len(order))
