"""Programmatic dependent launch (PDL) for our Triton kernels on Hopper and later: a kernel
launched with it may start while the kernel before it finishes, waits (`dependency_sync`)
before it reads that kernel's outputs or writes anything, and lets the next kernel start in
turn. Inside a CUDA graph this hides most of a launch's gap. COMPILED_LLM_PDL=0 turns it off."""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

ENV = "COMPILED_LLM_PDL"

try:  # Triton >= 3.4
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # older Triton: launch_kwargs() is then {} and PDL never True
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def dependency_sync(PDL: tl.constexpr):
    """Wait until the previous kernel is complete and its writes visible, then let the next
    kernel launch. Invariant: every program of a PDL launch calls it before any read of
    another kernel's output, any store and any early return (so completions stay in order)."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@functools.cache
def _supported(device_index: int) -> bool:
    if gdc_wait is None or os.environ.get("TRITON_INTERPRET", "0") == "1":
        return False
    from triton.backends.nvidia.compiler import CUDAOptions

    has_option = "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})
    return has_option and torch.cuda.get_device_capability(device_index) >= (9, 0)


def enabled(device: torch.device) -> bool:
    """Whether launches on device use PDL: a CUDA GPU of compute capability 9.0 or later, a
    Triton with the launch option, and COMPILED_LLM_PDL not 0."""
    if device.type != "cuda" or os.environ.get(ENV, "1").strip().lower() in ("0", "false"):
        return False
    return _supported(device.index if device.index is not None else 0)


def launch_kwargs(device: torch.device) -> dict:
    """The kernel arguments of a launch on device: PDL (the constexpr) and, where enabled,
    Triton's launch_pdl option."""
    return {"PDL": True, "launch_pdl": True} if enabled(device) else {"PDL": False}
