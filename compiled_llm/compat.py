"""Version shims for torch 2.11 .. 2.13, kept in this one module."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def allow_many_models(limit: int = 256) -> None:
    """Dynamo keeps one cache entry per model instance on the shared forward code object;
    a process holding many engines (tests, benchmarks) must not hit the default limit of 8."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                 "accumulated_cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), limit))


def mark_tokens_dynamic(*tensors: torch.Tensor) -> None:
    """Mark dim 0 (T) dynamic without specialising on 0/1, so no batch size recompiles."""
    for t in tensors:
        torch._dynamo.decorators.mark_unbacked(t, 0)


@contextmanager
def capture_inductor_code() -> Iterator[list[str]]:
    """Collect the Python output code Inductor generates inside the block."""
    from torch._inductor.graph import GraphLowering

    codes: list[str] = []
    original = GraphLowering.save_output_code
    GraphLowering.save_output_code = staticmethod(codes.append)
    try:
        yield codes
    finally:
        GraphLowering.save_output_code = original


def graph_break_count() -> int:
    return sum(torch._dynamo.utils.counters["graph_break"].values())
