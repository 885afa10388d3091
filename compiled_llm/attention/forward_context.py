"""The one documented forward context: what the attention op reads during a model forward.

The runner sets it around every forward; models never see it. It carries the step's attention
metadata, the per-layer KV cache tensors (and FP8 scales) and the CUDA-graph key the step runs
under, so the op's signature stays free of runtime state.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from compiled_llm.attention.metadata import AttentionMetadata


@dataclass(frozen=True)
class CUDAGraphKey:
    """Which captured graph runs a step: `mode` "full" (the whole model, pure decode) or
    "piecewise" (each compiled piece, attention eager between), at a padded token count. A
    full graph with query_len q > 1 runs num_tokens / q sequences of exactly q tokens each
    (speculative verification: k drafts + 1)."""

    mode: str
    num_tokens: int
    query_len: int = 1


@dataclass
class ForwardContext:
    """State shared by every attention call of one forward."""

    attn_metadata: AttentionMetadata | None
    kv_caches: list[torch.Tensor] = field(default_factory=list)  # per layer [2, N, bs, Hkv, D]
    backend: str = "torch"
    # the graph to replay (or capture, when capturing); None runs every piece plainly
    cudagraph_key: CUDAGraphKey | None = None
    capturing: bool = False
    # FP8 caches: per-layer scales [L, 2, Hkv]; with calibrate_kv_scales the op sets them from
    # this forward's K/V (the first real step, run without graphs) before writing the cache
    kv_scales: torch.Tensor | None = None
    calibrate_kv_scales: bool = False


_CONTEXT: ForwardContext | None = None


def current_forward_context() -> ForwardContext | None:
    """The context of the forward in progress, or None outside one."""
    return _CONTEXT


def get_forward_context() -> ForwardContext:
    """The context of the forward in progress; raises outside one."""
    if _CONTEXT is None:
        raise RuntimeError("attention called outside set_forward_context(); the runner sets it")
    return _CONTEXT


@contextmanager
def set_forward_context(ctx: ForwardContext) -> Iterator[None]:
    """Install ctx for the duration of one forward (nesting restores the outer one)."""
    global _CONTEXT
    prev, _CONTEXT = _CONTEXT, ctx
    try:
        yield
    finally:
        _CONTEXT = prev
