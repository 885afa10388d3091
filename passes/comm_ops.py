"""All-reduce fused with RMSNorm (and residual add): one custom op per tensor-parallel norm site.

The op stays opaque to Inductor: it is the slot for a one-shot all-reduce + norm kernel. Its body
today is the functional all-reduce followed by the reference norm, so numerics equal the unfused
graph's.
"""

from __future__ import annotations

import torch

from compiled_llm.passes.ops import LIB, fused_add_rms_norm_ref, rms_norm_ref


def all_reduce_sum(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """Functional sum all-reduce over the named process group, waited on."""
    out = torch.ops._c10d_functional.all_reduce(x, "sum", group_name)
    return torch.ops._c10d_functional.wait_tensor(out)


@torch.library.custom_op(f"{LIB}::all_reduce_rms_norm", mutates_args=())
def all_reduce_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
                        group_name: str) -> torch.Tensor:
    """rms_norm(all_reduce(x)); x [T, D]."""
    return rms_norm_ref(all_reduce_sum(x, group_name), weight, eps)


@all_reduce_rms_norm.register_fake
def _(x, weight, eps, group_name):
    return x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype))


@torch.library.custom_op(f"{LIB}::all_reduce_fused_add_rms_norm", mutates_args=())
def all_reduce_fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, group_name: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(all_reduce(x) + residual), all_reduce(x) + residual)."""
    normed, summed = fused_add_rms_norm_ref(all_reduce_sum(x, group_name), residual, weight, eps)
    return normed, summed


@all_reduce_fused_add_rms_norm.register_fake
def _(x, residual, weight, eps, group_name):
    summed = torch.empty_like(x + residual)
    normed = summed.new_empty(summed.shape, dtype=torch.promote_types(summed.dtype, weight.dtype))
    return normed, summed
