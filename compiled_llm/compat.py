"""Version shims for torch 2.11 .. 2.13, kept in this one module."""

from __future__ import annotations

import torch
from torch import nn

from compiled_llm.config import CompileConfig


def mark_tokens_dynamic(*tensors: torch.Tensor) -> None:
    """Mark dim 0 (T) dynamic without specialising on 0/1, so no batch size recompiles."""
    for t in tensors:
        torch._dynamo.decorators.mark_unbacked(t, 0)


def compile_model(model: nn.Module, cfg: CompileConfig):
    """Plain Inductor over the whole forward, T dynamic, no graph breaks allowed."""
    compiled = torch.compile(model, fullgraph=True, dynamic=False, backend="inductor")

    def forward(input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if cfg.dynamic_tokens:
            mark_tokens_dynamic(input_ids, positions)
        return compiled(input_ids, positions)

    return forward
