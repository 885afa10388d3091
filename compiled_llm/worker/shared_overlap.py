"""Load-time transform for CUDA: MoE blocks with a shared expert (Qwen2-MoE) run their routed
experts on a side stream while the shared expert runs on the main one (compiled_llm/moe/overlap.py
has the two ops and why they are safe)."""

from __future__ import annotations

import functools
import os

import torch
from torch import nn

from compiled_llm.distributed.tp_layers import reduced_class
from compiled_llm.models.moe import FusedMoE, SparseMoeBlock
from compiled_llm.moe.overlap import fused_moe_side_stream, moe_shared_join


def _overlapped_forward(self, hidden: torch.Tensor) -> torch.Tensor:
    """SparseMoeBlock.forward with the routed experts forked before, joined after the shared."""
    topk_weights, topk_ids = self.route(self.gate(hidden))
    routed = self.experts(hidden, topk_weights, topk_ids)  # returns at once: side stream
    return moe_shared_join(routed, self.shared_output(hidden), hidden, topk_weights, topk_ids)


@functools.cache
def overlapped_class(cls: type[nn.Module]) -> type[nn.Module]:
    """cls (a SparseMoeBlock) with the shared expert overlapped."""
    return type(f"Overlapped{cls.__name__}", (cls,), {
        "forward": _overlapped_forward, "__doc__": f"{cls.__name__}, shared expert overlapped."})


def _overlappable(module: nn.Module) -> bool:
    # bf16/fp16 stacked experts (FusedMoE, also under expert parallelism); FP8 experts run
    # their own op and stay sequential
    return (isinstance(module, SparseMoeBlock) and module.shared_expert is not None
            and isinstance(module.experts, FusedMoE))


OVERLAP_ENV = "COMPILED_LLM_SHARED_EXPERT_OVERLAP"


def shared_overlap_enabled() -> bool:
    """Opt-in ($COMPILED_LLM_SHARED_EXPERT_OVERLAP=1) until the overlap is measured on a GPU."""
    return os.environ.get(OVERLAP_ENV, "0") == "1"


def overlap_shared_experts(model: nn.Module) -> int:
    """Every overlappable block of the model overlapped in place (a tensor-parallel block
    stays all-reduced: its class is rebuilt over the overlapped one); returns how many. The
    loader applies it on CUDA when shared_overlap_enabled(); on the CPU the ops are sequential
    (tests use that)."""
    blocks = [module for module in model.modules() if _overlappable(module)]
    for block in blocks:
        reduced = getattr(block, "group_name", None) is not None  # reduced_class(base)
        base = type(block).__bases__[0] if reduced else type(block)
        overlapped = overlapped_class(base)
        block.__class__ = reduced_class(overlapped) if reduced else overlapped
        block.experts.expert_op = fused_moe_side_stream
    return len(blocks)
