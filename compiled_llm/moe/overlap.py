"""Shared experts overlapped with the routed ones on CUDA, as two ops the compiled graph keeps in
order: `fused_moe_side_stream` (fused_moe's contract) starts the routed experts on a side stream
and returns; the shared expert runs on the main stream meanwhile; `moe_shared_join` waits for the
side stream and adds both. The join takes the routed inputs so that they stay allocated until
the side stream is done with them. On CPU both ops are plain and sequential."""

from __future__ import annotations

import functools

import torch

from compiled_llm.moe import check_moe_shapes, epilogue_kwargs
from compiled_llm.moe.reference import fused_moe_reference


@functools.cache
def side_stream(device_index: int) -> torch.cuda.Stream:
    """The one side stream of a device (made on first use)."""
    return torch.cuda.Stream(device=device_index)


@torch.library.custom_op("compiled_llm::fused_moe_side_stream", mutates_args=())
def fused_moe_side_stream(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                          topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                          w13_bias: torch.Tensor | None = None,
                          w2_bias: torch.Tensor | None = None, activation: str = "silu",
                          swiglu_alpha: float = 1.702, swiglu_limit: float = 7.0) -> torch.Tensor:
    """compiled_llm::fused_moe's result (same arguments), computed on the device's side stream
    on CUDA (ready only after moe_shared_join); the reference elsewhere."""
    extras = epilogue_kwargs(w13_bias, w2_bias, activation, swiglu_alpha, swiglu_limit)
    check_moe_shapes(hidden, w13, w2, topk_weights, topk_ids, w13_bias, w2_bias)
    if not hidden.is_cuda:
        return fused_moe_reference(hidden, w13, w2, topk_weights, topk_ids, **extras)
    from compiled_llm.moe.triton_moe import fused_moe_triton

    out = torch.empty_like(hidden)  # the main stream's memory: freed only after the join
    side = side_stream(hidden.device.index or 0)
    side.wait_stream(torch.cuda.current_stream(hidden.device))
    with torch.cuda.stream(side):
        fused_moe_triton(hidden, w13, w2, topk_weights, topk_ids, out=out, **extras)
    return out


@fused_moe_side_stream.register_fake
def _(hidden, w13, w2, topk_weights, topk_ids, w13_bias=None, w2_bias=None, activation="silu",
      swiglu_alpha=1.702, swiglu_limit=7.0):
    return torch.empty_like(hidden)


@torch.library.custom_op("compiled_llm::moe_shared_join", mutates_args=())
def moe_shared_join(routed: torch.Tensor, shared: torch.Tensor, hidden: torch.Tensor,
                    topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """routed + shared, once the side stream's routed experts are done (hidden, topk_weights
    and topk_ids: the routed op's inputs, held until then)."""
    if routed.is_cuda:
        torch.cuda.current_stream(routed.device).wait_stream(
            side_stream(routed.device.index or 0))
    return routed + shared


@moe_shared_join.register_fake
def _(routed, shared, hidden, topk_weights, topk_ids):
    return torch.empty_like(routed)
