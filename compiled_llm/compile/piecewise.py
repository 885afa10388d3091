"""Piecewise CUDA graphs: each compiled piece captured per padded token count, with the
attention ops running eagerly between pieces (so mixed prefill/decode batches replay too).

A piece's inputs are parameters, outputs of the previous piece's graph (static), or attention
outputs (fresh each step): any input whose address moved since capture is copied into the
captured tensor before replay. All pieces of all sizes share one graph memory pool.
"""

from __future__ import annotations

import torch
from torch import nn

from compiled_llm.attention.forward_context import get_forward_context

_POOL = None


def graph_pool():
    global _POOL
    if _POOL is None:
        _POOL = torch.cuda.graph_pool_handle()
    return _POOL


class _Captured:
    def __init__(self, graph: torch.cuda.CUDAGraph, inputs: list, outputs) -> None:
        self.graph, self.inputs, self.outputs = graph, inputs, outputs
        self.ptrs = [a.data_ptr() if isinstance(a, torch.Tensor) else None for a in inputs]


class PiecewiseGraphPiece(nn.Module):
    """Wraps a compiled piece: plain call outside graph mode, capture or replay inside."""

    def __init__(self, piece: nn.Module) -> None:
        super().__init__()
        self.piece = piece
        self.graphs: dict[int, _Captured] = {}

    def forward(self, *args):
        try:
            ctx = get_forward_context()
        except RuntimeError:
            return self.piece(*args)
        size = ctx.cudagraph_tokens
        if size is None:
            return self.piece(*args)
        if size not in self.graphs:
            if not ctx.capturing:
                raise RuntimeError(f"no piecewise CUDA graph captured for {size} tokens")
            return self._capture(size, args)
        return self._replay(self.graphs[size], args)

    def _capture(self, size: int, args):
        self.piece(*args)  # warm-up outside the graph
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=graph_pool()):
            out = self.piece(*args)
        self.graphs[size] = _Captured(graph, list(args), out)
        return out

    @staticmethod
    def _replay(cap: _Captured, args):
        for i, a in enumerate(args):
            if cap.ptrs[i] is not None and a.data_ptr() != cap.ptrs[i]:
                cap.inputs[i].copy_(a, non_blocking=True)
        cap.graph.replay()
        return cap.outputs


def piecewise_sizes(max_tokens: int) -> list[int]:
    """Powers of two up to max_tokens: few sizes keep the kept outputs' memory small."""
    sizes, s = [], 1
    while s <= max_tokens:
        sizes.append(s)
        s *= 2
    return sizes
