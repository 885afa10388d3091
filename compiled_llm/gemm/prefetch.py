"""The `compiled_llm::l2_prefetch` op: bring the first bytes of a weight into the GPU's L2 while
latency-bound kernels run (decode attention leaves HBM idle), so the GEMM that reads it next
starts from L2. Hopper's bulk prefetch (`cp.async.bulk.prefetch.L2`) issues the reads from every
SM and returns at once; elsewhere (CPU, pre-Hopper GPUs, the interpreter, many tokens) the op does
nothing. Put in the graph by passes/l2_weight_prefetch.py."""

from __future__ import annotations

import functools
import os

import torch

from compiled_llm.gemm.tuning import MAX_M

CHUNK_BYTES = 4096  # one bulk prefetch: a multiple of 16 bytes, from a 16-byte aligned address


@functools.cache
def _device_facts(device_index: int) -> tuple[bool, int, int]:
    """(bulk prefetch available, L2 bytes, SM count) of a CUDA device."""
    props = torch.cuda.get_device_properties(device_index)
    hopper = (props.major, props.minor) >= (9, 0)
    return hopper, int(props.L2_cache_size), int(props.multi_processor_count)


def prefetch_bytes(weight: torch.Tensor, tokens: int, l2_fraction: float) -> int:
    """How many of weight's first bytes to prefetch: 0 unless a contiguous CUDA weight on
    Hopper or later, at most MAX_M tokens (past that the GEMM is not bound by its weight read),
    and not under the Triton interpreter; else up to l2_fraction of the L2, whole chunks."""
    if (weight.device.type != "cuda" or tokens > MAX_M or not weight.is_contiguous()
            or os.environ.get("TRITON_INTERPRET", "0") == "1"):
        return 0
    hopper, l2_bytes, _ = _device_facts(weight.device.index or 0)
    if not hopper or weight.data_ptr() % 16:
        return 0
    budget = min(weight.numel() * weight.element_size(), int(l2_fraction * l2_bytes))
    return budget - budget % CHUNK_BYTES


@torch.library.custom_op("compiled_llm::l2_prefetch", mutates_args=())
def l2_prefetch(weight: torch.Tensor, hidden: torch.Tensor, l2_fraction: float) -> None:
    """Prefetch weight's first prefetch_bytes(weight, hidden's rows, l2_fraction) bytes into
    L2; reads nothing of hidden but its row count. Changes no tensor: a hint only."""
    num_bytes = prefetch_bytes(weight, hidden.shape[0], l2_fraction)
    if num_bytes == 0:
        return
    from compiled_llm.gemm.prefetch_kernel import launch_l2_prefetch

    _, _, sm_count = _device_facts(weight.device.index or 0)
    launch_l2_prefetch(weight.view(-1).view(torch.uint8), num_bytes // CHUNK_BYTES, CHUNK_BYTES,
                       sm_count)


@l2_prefetch.register_fake
def _l2_prefetch_fake(weight, hidden, l2_fraction):
    return None


# a hint with no output: FX's dead-code elimination must keep it where the pass put it
torch.fx.node.has_side_effect(torch.ops.compiled_llm.l2_prefetch.default)
