"""All-reduce fused with RMSNorm (and residual add): one custom op per tensor-parallel norm site.

The op stays opaque to Inductor: it is the slot for a one-shot all-reduce + norm kernel. Its body
is the all-reduce followed by the reference norm, so numerics equal the unfused graph's; on CUDA
a small all-reduce (decode-sized) is torch's symmetric-memory one-shot all-reduce, else NCCL's.
"""

from __future__ import annotations

import os

import torch

from compiled_llm.passes.ops import LIB, fused_add_rms_norm_ref, rms_norm_ref

# inputs up to this size go through the one-shot all-reduce (each rank reads its peers' copies)
SYMM_MEM_MAX_BYTES = 512 << 10
ENV_SYMM_MEM = "COMPILED_LLM_SYMM_MEM_ALLREDUCE"  # "0": always NCCL
_symm_buffers: dict[tuple, torch.Tensor | None] = {}  # (group, dtype, device) -> buffer or None


def _symm_buffer(group_name: str, x: torch.Tensor) -> torch.Tensor | None:
    """The group's symmetric buffer for x's dtype, made (a collective: every rank makes it at
    the same call) on first use; None where torch or the device does not offer one."""
    key = (group_name, x.dtype, x.device)
    if key not in _symm_buffers:
        _symm_buffers[key] = None
        try:
            import torch.distributed._symmetric_memory as symm_mem

            torch.ops.symm_mem.one_shot_all_reduce  # noqa: B018 (AttributeError if absent)
            buffer = symm_mem.empty(SYMM_MEM_MAX_BYTES // x.element_size(), dtype=x.dtype,
                                    device=x.device)
            symm_mem.rendezvous(buffer, group_name)
            _symm_buffers[key] = buffer
        except (ImportError, RuntimeError, AttributeError):
            pass  # no symmetric memory here: NCCL from now on
    return _symm_buffers[key]


def all_reduce_sum(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """Sum x over the named process group: the one-shot symmetric-memory all-reduce for a
    small CUDA tensor where torch has it, else the functional (NCCL or gloo) all-reduce.
    The choice depends only on x's size, so every rank makes the same one."""
    small = x.is_cuda and x.numel() * x.element_size() <= SYMM_MEM_MAX_BYTES
    if small and os.environ.get(ENV_SYMM_MEM, "1") != "0":
        buffer = _symm_buffer(group_name, x)
        if buffer is not None:
            flat = buffer[:x.numel()]
            flat.copy_(x.reshape(-1))
            out = torch.ops.symm_mem.one_shot_all_reduce(flat, "sum", group_name)
            return out.view(x.shape)
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
