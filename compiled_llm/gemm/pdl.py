"""Programmatic dependent launch (PDL) for our Triton kernels on Hopper and later: a kernel
launched with it may start while the kernel before it finishes and waits (`dependency_sync`)
before it reads that kernel's outputs or writes anything. Opt-in: COMPILED_LLM_PDL=1 (wait),
=2 (wait, then let the next kernel launch at once). On the H200 both slowed Qwen3-0.6B's
batch-1 decode (by 12% and 6%) and left Llama-3-8B's within noise (docs/benchmarks.md, 56-57)."""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

ENV = "COMPILED_LLM_PDL"

try:  # Triton >= 3.4
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # older Triton: enabled() is then False and the kernels get PDL=0
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def dependency_sync(PDL: tl.constexpr):
    """PDL >= 1: wait until the previous kernel is complete and its writes visible; PDL 2:
    then let the next kernel launch (else it launches as this one's programs exit). Invariant:
    every program of a PDL launch calls it before any read of another kernel's output, any
    store and any early return (so completions stay in order)."""
    if PDL >= 1:
        gdc_wait()
    if PDL >= 2:
        gdc_launch_dependents()


@functools.cache
def _supported(device_index: int) -> bool:
    if gdc_wait is None or os.environ.get("TRITON_INTERPRET", "0") == "1":
        return False
    from triton.backends.nvidia.compiler import CUDAOptions

    has_option = "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})
    return has_option and torch.cuda.get_device_capability(device_index) >= (9, 0)


def level() -> int:
    """COMPILED_LLM_PDL: 0 (off, the default), 1 or 2; ValueError for anything else."""
    raw = os.environ.get(ENV, "0").strip()
    if raw not in ("0", "1", "2"):
        raise ValueError(f"{ENV} must be 0, 1 or 2, got {raw!r}")
    return int(raw)


def enabled(device: torch.device) -> bool:
    """Whether launches on device use PDL: asked for (level() > 0), a CUDA GPU of compute
    capability 9.0 or later, and a Triton with the launch option."""
    if device.type != "cuda" or level() == 0:
        return False
    return _supported(device.index if device.index is not None else 0)


def launch_kwargs(device: torch.device) -> dict:
    """The kernel arguments of a launch on device: PDL (the constexpr level) and, where
    enabled, Triton's launch_pdl option. Decided once per CUDA device and process: eager
    attention launches it every step, so the switch is not read each time."""
    if device.type != "cuda":
        return _OFF
    return _cuda_launch_kwargs(device.index if device.index is not None else 0)


_OFF = {"PDL": 0}


@functools.cache
def _cuda_launch_kwargs(device_index: int) -> dict:
    device = torch.device("cuda", device_index)
    return {"PDL": level(), "launch_pdl": True} if enabled(device) else _OFF
