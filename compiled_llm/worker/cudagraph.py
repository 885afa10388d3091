"""CUDA graphs, owned by the worker: the captured sizes, the dispatcher mapping a step to its
graph key, and the one wrapper that captures and replays full and piecewise graphs. A full graph
is the whole model for a padded pure-decode batch (or a verify batch: k + 1 tokens for every
sequence); piecewise graphs are the compiled pieces (attention eager between) for any batch
padded to a captured token count; one pool per engine.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from compiled_llm.attention.forward_context import CUDAGraphKey, current_forward_context
from compiled_llm.compile.counters import counters

FULL, PIECEWISE = "full", "piecewise"


def full_graph_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, 16, 24, 32, then every 16 up to max_num_seqs (and max_num_seqs itself):
    fine steps where padding costs most, few graphs overall so capture stays short."""
    sizes = [s for s in (1, 2, 4, 8, 16, 24, 32) if s <= max_num_seqs]
    sizes += list(range(48, max_num_seqs + 1, 16))
    return sorted({*sizes, max_num_seqs})


def piecewise_graph_sizes(max_tokens: int) -> list[int]:
    """Powers of two below max_tokens, then max_tokens itself: few sizes keep the kept outputs'
    memory small, and a step of max_tokens (a token budget of 1536, say) still replays one."""
    sizes, size = [], 1
    while size < max_tokens:
        sizes.append(size)
        size *= 2
    return sizes + [max_tokens] if max_tokens >= 1 else sizes


class CUDAGraphDispatcher:
    """Maps a step's (sequences, tokens, max query length) to the graph that runs it. Empty
    until graphs are captured (then every step runs plainly). uniform_sizes are the sequence
    counts with a full graph of uniform_query_len tokens per sequence (verify steps)."""

    def __init__(self) -> None:
        self.full_sizes: list[int] = []
        self.piecewise_sizes: list[int] = []
        self.uniform_sizes: list[int] = []
        self.uniform_query_len = 0

    def dispatch(self, num_seqs: int, num_tokens: int, max_query_len: int) -> CUDAGraphKey | None:
        """A full graph for a pure-decode batch, or for one whose every sequence has
        uniform_query_len tokens, that fits one; else the smallest piecewise size holding
        every token, else None."""
        full = self.full_sizes
        if max_query_len == 1 and full and num_seqs <= full[-1]:
            return CUDAGraphKey(FULL, next(s for s in full if s >= num_seqs))
        query_len, uniform = self.uniform_query_len, self.uniform_sizes
        if (max_query_len == query_len and num_tokens == num_seqs * query_len and uniform
                and num_seqs <= uniform[-1]):
            seqs = next(s for s in uniform if s >= num_seqs)
            return CUDAGraphKey(FULL, seqs * query_len, query_len)
        size = next((s for s in self.piecewise_sizes if s >= num_tokens), None)
        return None if size is None else CUDAGraphKey(PIECEWISE, size)


class _Captured:
    """One captured graph: its inputs and outputs as captured, and the inputs' addresses."""

    def __init__(self, graph: torch.cuda.CUDAGraph, inputs: list, outputs) -> None:
        self.graph, self.inputs, self.outputs = graph, inputs, outputs
        self.addresses = [a.data_ptr() if isinstance(a, torch.Tensor) else None for a in inputs]


class CUDAGraphWrapper(nn.Module):
    """Runs `runnable` plainly, or, when the forward context's key has this wrapper's mode,
    captures (while capturing) or replays the graph of the key's size. On replay, an input
    whose address moved since capture is copied into the captured tensor first; inputs read
    from the persistent step buffers never move, so a steady-state replay copies nothing."""

    def __init__(self, runnable, mode: str, pool, stream: torch.cuda.Stream | None = None
                 ) -> None:
        super().__init__()
        self.runnable, self.mode, self.pool = runnable, mode, pool
        self.graphs: dict[tuple[int, int], _Captured] = {}  # (tokens, query_len)
        # the side stream captures run on: one for every wrapper sharing the pool, since the
        # allocator reuses a freed block only on the stream that allocated it
        self.stream = stream

    def forward(self, *args):
        """runnable(*args): plainly, or through the graph the forward context's key names."""
        ctx = current_forward_context()
        key = None if ctx is None else ctx.cudagraph_key
        if key is None or key.mode != self.mode:
            return self.runnable(*args)
        size = (key.num_tokens, key.query_len)
        captured = self.graphs.get(size)
        if captured is None:
            if not ctx.capturing:
                raise RuntimeError(f"no {self.mode} CUDA graph captured for {key.num_tokens} "
                                   f"tokens ({key.query_len} per sequence)")
            return self._capture(size, args)
        counters.verify_graph_replays += int(key.query_len > 1)
        return self._replay(captured, args)

    def _capture(self, size: tuple[int, int], args):
        self.runnable(*args)  # warm-up outside the graph: lazy initialisation, autotuning
        graph = torch.cuda.CUDAGraph()
        if self.stream is None:
            self.stream = torch.cuda.Stream()
        with capturing_into(graph, self.pool, self.stream):
            out = self.runnable(*args)
        self.graphs[size] = _Captured(graph, list(args), out)
        return out

    def _replay(self, captured: _Captured, args):
        for i, arg in enumerate(args):
            address = captured.addresses[i]
            if address is not None and arg.data_ptr() != address:
                captured.inputs[i].copy_(arg, non_blocking=True)
        captured.graph.replay()
        counters.full_graph_replays += int(self.mode == FULL)
        return captured.outputs

    def release(self) -> None:
        """Drop every captured graph (their pool memory goes back once all are gone)."""
        self.graphs.clear()


@contextlib.contextmanager
def capturing_into(graph: torch.cuda.CUDAGraph, pool, stream: torch.cuda.Stream) -> Iterator[None]:
    """torch.cuda.graph without its flush of the allocator's caches (device and pinned host)
    before every capture: a start-up captures hundreds of graphs (every piece at every size),
    and each flush frees the warm-up's blocks only for the next warm-up to allocate them
    again. The caller flushes once before its captures (capture_cudagraphs)."""
    torch.cuda.synchronize()  # the warm-up's work is done before the side stream records
    with torch.cuda.stream(stream):
        graph.capture_begin(pool)
        try:
            yield
        finally:
            graph.capture_end()
