"""N-gram prompt lookup on the device: the batch's token histories live in one device buffer
(a row per request, updated with each step's new tokens only), and one torch formulation
(compare, shift, compare) proposes for every request at once, with no per-request host work;
the drafts come back in a single read. The same lookup as proposers.ngram_propose."""

from __future__ import annotations

import numpy as np
import torch

from compiled_llm.core.request import Request
from compiled_llm.core.scheduler import SchedulerOutput
from compiled_llm.sample.spec_decode.proposers import (
    NgramProposer,
    Sampled,
    new_tokens_of,
    register_proposer,
    spec_eligible,
)
from compiled_llm.sample.uploads import upload
from compiled_llm.speculative import SpeculativeConfig


def ngram_propose_batch(history: torch.Tensor, lengths: torch.Tensor, min_n: int, max_n: int,
                        k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(drafts [B, k], number of drafts [B]) for histories [B, W] whose rows hold lengths[b]
    tokens (lengths >= 1; columns past them are ignored): per row the k tokens after the
    latest earlier occurrence of its longest suffix n-gram, min_n <= n <= max_n. Drafts past
    a row's count are -1. No host synchronisation."""
    width = history.shape[1]
    pos = torch.arange(width, device=history.device)
    last = (lengths - 1)[:, None]  # [B, 1]
    # match[b, e]: tokens ending at e (an earlier position) equal the suffix so far
    match = (history == history.gather(1, last)) & (pos < last)
    best = torch.full_like(lengths, -1)
    for size in range(1, max_n + 1):
        if size >= min_n:
            latest = torch.where(match, pos, -1).amax(dim=1)
            best = torch.where(latest >= 0, latest, best)  # a longer match wins
        if size == max_n:
            break
        before = torch.nn.functional.pad(history[:, :width - size], (size, 0), value=-1)
        want = history.gather(1, (last - size).clamp(min=0))
        match &= before == want
    index = best[:, None] + 1 + torch.arange(k, device=history.device)
    valid = (best[:, None] >= 0) & (index < lengths[:, None])
    drafts = history.gather(1, index.clamp(max=width - 1))
    return torch.where(valid, drafts, -1), valid.sum(dim=1)


class DeviceHistory:
    """Token histories in a device buffer [rows, width] of int32 (width grows on demand, up to
    max_len). Invariant: the row of a request holds its first `written` known tokens."""

    def __init__(self, rows: int, max_len: int, device: torch.device) -> None:
        self.max_len, self.device = max_len, device
        self.buffer = torch.zeros(rows, min(max_len, 256), dtype=torch.int32, device=device)
        self.free = list(range(rows - 1, -1, -1))
        self.slots: dict[str, tuple[Request, int, int]] = {}  # id -> (request, row, written)

    def update(self, items: list[tuple[Request, list[int]]]) -> tuple[list[int], list[int]]:
        """Write each request's unwritten tokens and its new ones (one upload); rows of
        requests missing from items are freed. Returns (rows, lengths) in items' order."""
        keep = {req.request_id for req, _ in items}
        for request_id in [rid for rid in self.slots if rid not in keep]:
            self.free.append(self.slots.pop(request_id)[1])
        rows, lengths, writes = [], [], []
        for req, new in items:
            slot = self.slots.get(req.request_id)
            if slot is None or slot[0] is not req:  # new here (or a reused id)
                slot = (req, self.free.pop() if slot is None else slot[1], 0)
            known = req.all_token_ids
            row, written = slot[1], slot[2]
            writes.append((row, written, known[written:] + new))
            self.slots[req.request_id] = (req, row, len(known))
            rows.append(row)
            lengths.append(len(known) + len(new))
        self._write(writes, max(lengths, default=0))
        return rows, lengths

    def _write(self, writes: list[tuple[int, int, list[int]]], width: int) -> None:
        """One index_put of every (row, first position, tokens) run."""
        if width > self.buffer.shape[1]:
            grown = torch.zeros(self.buffer.shape[0], min(self.max_len, 2 * width),
                                dtype=torch.int32, device=self.device)
            grown[:, :self.buffer.shape[1]] = self.buffer
            self.buffer = grown
        counts = [len(tokens) for _, _, tokens in writes]
        if not sum(counts):
            return
        rows = np.repeat([row for row, _, _ in writes], counts)
        starts = np.repeat([start for _, start, _ in writes], counts)
        offsets = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
        flat = [token for _, _, tokens in writes for token in tokens]
        index = upload(np.stack([rows, starts + offsets]), torch.int64, self.device)
        values = upload(flat, torch.int32, self.device)
        self.buffer.index_put_((index[0], index[1]), values)


class DeviceNgramProposer(NgramProposer):
    """The n-gram proposer over a DeviceHistory: the lookup of the whole batch runs as a few
    device kernels, whatever the batch size (the host lookup costs per request)."""

    def __init__(self, cfg: SpeculativeConfig, device: torch.device, max_num_seqs: int,
                 max_len: int, **context) -> None:
        super().__init__(cfg)
        self.history = DeviceHistory(max_num_seqs, max_len, device)

    def propose(self, sched: SchedulerOutput, sampled: Sampled) -> dict[str, list[int]]:
        """Drafts for the requests that sampled in this step, after its tokens."""
        items = [(req, new_tokens_of(new)) for req, _ in sched.scheduled
                 if (new := sampled.get(req.request_id)) is not None
                 and not req.is_finished and spec_eligible(req)]
        rows, lengths = self.history.update(items)
        if not items:
            return {}
        device = self.history.device
        history = self.history.buffer.index_select(0, upload(rows, torch.int64, device))
        drafts, counts = ngram_propose_batch(
            history[:, :max(lengths)], upload(lengths, torch.int64, device),
            self.cfg.prompt_lookup_min, self.cfg.prompt_lookup_max, self.k)
        table = torch.cat([counts[:, None], drafts], dim=1).tolist()  # the one read
        return {req.request_id: row[1:1 + row[0]] for (req, _), row in zip(items, table)
                if row[0]}


@register_proposer("ngram")
def make_ngram_proposer(cfg: SpeculativeConfig, target=None, **context) -> NgramProposer:
    """The n-gram proposer for the target runner: the device lookup when it runs on CUDA,
    else the host one."""
    if target is not None and target.device.type == "cuda":
        return DeviceNgramProposer(cfg, target.device, target.max_num_seqs,
                                   target.max_model_len)
    return NgramProposer(cfg)
