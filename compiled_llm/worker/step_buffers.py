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


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


@dataclass(frozen=True)
class Layout:
    """Offsets of one step's segments in the packed buffers. ids/positions/slots/rows depend
    on the padded token count only and qsl/seq_lens on the padded sequence count only, so a
    CUDA graph captured at one size reads the same addresses that every step of that size
    fills."""

    tokens: int  # P: padded token rows
    seqs: int  # padded sequences
    num_sample: int = 0
    num_entries: int = 0  # block-table entries written this step

    @property
    def pos(self) -> int:
        return _aligned(self.tokens)

    @property
    def slots(self) -> int:
        return 2 * _aligned(self.tokens)

    @property
    def rows(self) -> int:
        return 3 * _aligned(self.tokens)

    @property
    def sample(self) -> int:
        return self.rows + _aligned(self.seqs)

    @property
    def entry_idx(self) -> int:
        return self.sample + _aligned(self.num_sample)

    @property
    def end64(self) -> int:
        return self.entry_idx + self.num_entries

    @property
    def seq_lens(self) -> int:
        return _aligned(self.seqs + 1)

    @property
    def entry_val(self) -> int:
        return self.seq_lens + _aligned(self.seqs)

    @property
    def end32(self) -> int:
        return self.entry_val + self.num_entries


class Views:
    """Host (numpy and torch) and device views of the segments a step of P padded tokens and
    `seqs` padded sequences fills; made once per shape (torch slicing costs microseconds)."""

    def __init__(self, bufs: InputBatch, tokens: int, seqs: int) -> None:
        lay = Layout(tokens, seqs)
        p, s, a, b = lay.pos, lay.slots, lay.rows, lay.seq_lens
        self.np64 = {"ids": slice(0, tokens), "pos": slice(p, p + tokens),
                     "slots": slice(s, s + tokens), "rows": slice(a, a + seqs)}
        self.np32 = {"qsl": slice(0, seqs + 1), "seq_lens": slice(b, b + seqs)}
        d64, d32 = bufs.i64.dev, bufs.i32.dev
        self.dev = {k: d64[v] for k, v in self.np64.items()}
        self.dev.update({k: d32[v] for k, v in self.np32.items()})
        self.dev["block_tables"] = bufs.batch_table[:seqs]
        self.host32 = {k: bufs.i32.host[v] for k, v in self.np32.items()}

    def host(self, bufs: InputBatch) -> dict[str, np.ndarray]:
        """Numpy views to fill in place."""
        a, b = bufs.i64.np, bufs.i32.np
        return {**{k: a[v] for k, v in self.np64.items()},
                **{k: b[v] for k, v in self.np32.items()}}


class PackedBuffer:
    """One host buffer (pinned when the device is CUDA) with a numpy view, and its device twin
    (the host tensor itself on CPU). A step fills a prefix and copies it in one transfer."""

    def __init__(self, size: int, dtype: torch.dtype, device: torch.device) -> None:
        cuda = device.type == "cuda"
        self.host = torch.zeros(size, dtype=dtype, pin_memory=cuda)
        self.np = self.host.numpy()
        self.dev = torch.zeros(size, dtype=dtype, device=device) if cuda else self.host

    def send(self, n: int) -> None:
        """Copy host[:n] to the device without blocking the host."""
        if self.dev is not self.host and n:
            self.dev[:n].copy_(self.host[:n], non_blocking=True)


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

    @property
    def num_owned(self) -> int:
        return len(self._owned)

    def row_of(self, request_id: str) -> int | None:
        entry = self._owned.get(request_id)
        return None if entry is None else entry[0]

    def release(self, request_ids) -> None:
        """Give the rows of these requests back (unknown ids are ignored)."""
        for rid in request_ids:
            entry = self._owned.pop(rid, None)
            if entry is not None:
                self._free.append(entry[0])

    def update(self, reqs: list, rows: np.ndarray) -> np.ndarray:
        """Fill rows[i] with reqs[i]'s row and the host mirror with its new entries; returns
        the flat indices of the entries to write on the device."""
        spans, width, owned = [], self.width, self._owned
        for i, req in enumerate(reqs):
            blocks = req.block_ids
            entry = owned.get(req.request_id)
            if entry is None:
                entry = owned[req.request_id] = [self._take(), blocks, 0]
            elif entry[1] is not blocks or len(blocks) < entry[2]:
                entry[1], entry[2] = blocks, 0
            row, done, n = entry[0], entry[2], len(blocks)
            rows[i] = row
            if n != done:
                if n > width:
                    raise ValueError(f"request {req.request_id} holds {n} blocks; the table "
                                     f"has {width} per row (max_model_len)")
                self.host[row, done:n] = blocks[done:]
                spans.append(np.arange(row * width + done, row * width + n))
                entry[2] = n
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
        self._free = list(range(2 * old - 1, old - 1, -1))
