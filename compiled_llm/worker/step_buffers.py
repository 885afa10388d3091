"""The parts of the input batch's persistent buffers: packed host/device inputs (one int64
and one int32 copy a step), their per-shape layout and views, and the device block table kept
per request (only new entries are written). Sized once by the input batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from compiled_llm.worker.input_batch import InputBatch

_ALIGN = 16  # segment starts in elements: keeps every view 64-byte aligned for the kernels


def _aligned(count: int) -> int:
    return -(-count // _ALIGN) * _ALIGN


def table_width(blocks: int, max_blocks: int) -> int:
    """Block-table columns a step gathers for its longest sequence's `blocks`: the next power
    of two (at most max_blocks), so a handful of widths, each with its views made once."""
    return min(1 << max(0, blocks - 1).bit_length(), max_blocks)


@dataclass(frozen=True)
class Layout:
    """Offsets of one step's segments in the packed buffers. ids/positions/slots/rows depend
    on the padded token count only and query starts/seq_lens on the padded sequence count only,
    so a CUDA graph captured at one size reads the same addresses that every step of that size
    fills. int64 buffer: ids, pos, slots, rows, sample, entry_idx; int32: query starts,
    seq_lens, decode order, entry_val."""

    tokens: int  # P: padded token rows
    seqs: int  # padded sequences
    num_sample: int = 0
    num_entries: int = 0  # block-table entries written this step

    @property
    def pos(self) -> int:
        """int64 start of the positions [P] (the token ids [P] start at 0)."""
        return _aligned(self.tokens)

    @property
    def slots(self) -> int:
        """int64 start of the cache slots [P]."""
        return 2 * _aligned(self.tokens)

    @property
    def rows(self) -> int:
        """int64 start of each sequence's block-table row [seqs]."""
        return 3 * _aligned(self.tokens)

    @property
    def sample(self) -> int:
        """int64 start of the hidden row of each sampling request [num_sample]."""
        return self.rows + _aligned(self.seqs)

    @property
    def entry_idx(self) -> int:
        """int64 start of the flat block-table indices written this step [num_entries]."""
        return self.sample + _aligned(self.num_sample)

    @property
    def end64(self) -> int:
        """int64 elements the step fills (and copies)."""
        return self.entry_idx + self.num_entries

    @property
    def seq_lens(self) -> int:
        """int32 start of the seq_lens [seqs] (the query starts [seqs + 1] start at 0)."""
        return _aligned(self.seqs + 1)

    @property
    def order(self) -> int:
        """int32 start of the decode order [seqs] (AttentionMetadata.decode_order)."""
        return self.seq_lens + _aligned(self.seqs)

    @property
    def entry_val(self) -> int:
        """int32 start of the block ids written this step [num_entries]."""
        return self.order + _aligned(self.seqs)

    @property
    def end32(self) -> int:
        """int32 elements the step fills (and copies)."""
        return self.entry_val + self.num_entries


class Views:
    """Host (numpy and torch) and device views of the segments a step of P padded tokens and
    `seqs` padded sequences fills; made once per shape (torch slicing costs microseconds)."""

    def __init__(self, bufs: InputBatch, tokens: int, seqs: int) -> None:
        layout = Layout(tokens, seqs)
        self.slices64 = {"ids": slice(0, tokens),
                         "pos": slice(layout.pos, layout.pos + tokens),
                         "slots": slice(layout.slots, layout.slots + tokens),
                         "rows": slice(layout.rows, layout.rows + seqs)}
        self.slices32 = {"query_start_loc": slice(0, seqs + 1),
                         "seq_lens": slice(layout.seq_lens, layout.seq_lens + seqs),
                         "order": slice(layout.order, layout.order + seqs)}
        dev64, dev32 = bufs.packed64.dev, bufs.packed32.dev
        self.dev = {name: dev64[span] for name, span in self.slices64.items()}
        self.dev.update({name: dev32[span] for name, span in self.slices32.items()})
        self.dev["block_tables"] = bufs.batch_table[:seqs]
        self.host32 = {name: bufs.packed32.host[span] for name, span in self.slices32.items()}
        self._tables: dict[int, torch.Tensor] = {}

    def table_columns(self, width: int) -> torch.Tensor:
        """The block table's first `width` columns of these rows (the gather's output)."""
        view = self._tables.get(width)
        if view is None:
            view = self._tables[width] = self.dev["block_tables"][:, :width]
        return view

    def host(self, bufs: InputBatch) -> dict[str, np.ndarray]:
        """Numpy views to fill in place."""
        host64, host32 = bufs.packed64.host_np, bufs.packed32.host_np
        return {**{name: host64[span] for name, span in self.slices64.items()},
                **{name: host32[span] for name, span in self.slices32.items()}}


class PackedBuffer:
    """One host buffer (pinned when the device is CUDA) with a numpy view, and its device twin
    (the host tensor itself on CPU). A step fills a prefix and copies it in one transfer."""

    def __init__(self, size: int, dtype: torch.dtype, device: torch.device) -> None:
        cuda = device.type == "cuda"
        self.host = torch.zeros(size, dtype=dtype, pin_memory=cuda)
        self.host_np = self.host.numpy()
        self.dev = torch.zeros(size, dtype=dtype, device=device) if cuda else self.host

    def send(self, count: int) -> None:
        """Copy host[:count] to the device without blocking the host."""
        if self.dev is not self.host and count:
            self.dev[:count].copy_(self.host[:count], non_blocking=True)


class BlockTableRows:
    """Device block table [rows, width] int32 with a host mirror: each live request owns a row
    (row 0 stays zeros, for padding). A step writes only entries added since the row was last
    written; a request whose block list was replaced (freed, preempted) is rewritten from 0."""

    def __init__(self, num_rows: int, width: int, device: torch.device) -> None:
        self.width = width
        self.host = np.zeros((num_rows + 1, width), dtype=np.int32)
        self.device = torch.zeros(num_rows + 1, width, dtype=torch.int32, device=device)
        self._free = list(range(num_rows, 0, -1))
        self._owned: dict[str, list] = {}  # request id -> [row, block list, entries written]
        self._columns: dict[int, torch.Tensor] = {}

    def columns(self, width: int) -> torch.Tensor:
        """The device table's first `width` columns, every row (the gather's source)."""
        view = self._columns.get(width)
        if view is None:
            view = self._columns[width] = self.device[:, :width]
        return view

    @property
    def num_owned(self) -> int:
        """Requests holding a row."""
        return len(self._owned)

    def row_of(self, request_id: str) -> int | None:
        """The row the request holds, or None."""
        entry = self._owned.get(request_id)
        return None if entry is None else entry[0]

    def release(self, request_ids) -> None:
        """Give the rows of these requests back (unknown ids are ignored)."""
        for request_id in request_ids:
            entry = self._owned.pop(request_id, None)
            if entry is not None:
                self._free.append(entry[0])

    def unsent(self, request_ids) -> None:
        """Mark these requests' rows as not yet on the device (a fill that was never sent):
        the next update writes them whole."""
        for request_id in request_ids:
            entry = self._owned.get(request_id)
            if entry is not None:
                entry[2] = 0

    def update(self, reqs: list, rows: np.ndarray) -> np.ndarray:
        """Fill rows[i] with reqs[i]'s row and the host mirror with its new entries; returns
        the flat indices of the entries to write on the device."""
        spans, width, owned, row_ids = [], self.width, self._owned, []
        for req in reqs:
            blocks = req.block_ids
            num_blocks = len(blocks)
            entry = owned.get(req.request_id)
            if entry is None:
                entry = owned[req.request_id] = [self._take(), blocks, 0]
            elif entry[1] is not blocks or num_blocks < entry[2]:
                entry[1], entry[2] = blocks, 0
            row_ids.append(entry[0])  # (written in one numpy call below: hot)
            if num_blocks != entry[2]:  # (the usual decode step writes no entry: hot)
                row, written = entry[0], entry[2]
                if num_blocks > width:
                    raise ValueError(f"request {req.request_id} holds {num_blocks} blocks; the "
                                     f"table has {width} per row (max_model_len)")
                self.host[row, written:num_blocks] = blocks[written:]
                spans.append(np.arange(row * width + written, row * width + num_blocks))
                entry[2] = num_blocks
        rows[:len(row_ids)] = row_ids
        if not spans:
            return np.zeros(0, dtype=np.int64)
        return spans[0] if len(spans) == 1 else np.concatenate(spans)

    def _take(self) -> int:
        if not self._free:
            self._grow()
        return self._free.pop()

    def _grow(self) -> None:
        # only reached when more requests are live than the table was sized for
        old = self.host.shape[0]
        self.host = np.concatenate([self.host, np.zeros_like(self.host)])
        self.device = torch.cat([self.device, torch.zeros_like(self.device)])
        self._columns.clear()
        self._free = list(range(2 * old - 1, old - 1, -1))
