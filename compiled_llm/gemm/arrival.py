"""Arrival counters of the one-launch split reductions (split-K small-M GEMMs, split decode
attention): one zeroed int32 buffer per device, each launch's last programs resetting theirs.
The GEMMs' are opt-in (COMPILED_LLM_ONE_LAUNCH_SPLITS=1): on the H200 the fence, atomic and
dependent loads cost more than a second kernel's launch in a CUDA graph (docs/benchmarks.md,
call 35); the decode's callers ask for them by their config."""

from __future__ import annotations

import os

import torch

SLOTS = 1 << 16  # column blocks (GEMM) or (sequence, KV head) pairs (decode) one launch may use
ONE_LAUNCH = os.environ.get("COMPILED_LLM_ONE_LAUNCH_SPLITS", "0") == "1"
_COUNTERS: dict[torch.device, torch.Tensor] = {}


def arrival_counters(device: torch.device, enabled: bool | None = None) -> torch.Tensor | None:
    """The device's SLOTS counters, zero between launches; None when the one-launch path is off
    (enabled, else COMPILED_LLM_ONE_LAUNCH_SPLITS),
    or while a CUDA graph is captured before they exist (a buffer from the graph's pool would be
    zeroed only on replay). Invariant: launches sharing them run one after another on one stream
    (the forward's; MoE's side stream runs neither kernel); not keyed by stream, as a graph may
    be captured on a side stream."""
    if not (ONE_LAUNCH if enabled is None else enabled):
        return None
    counters = _COUNTERS.get(device)
    if counters is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        counters = _COUNTERS[device] = torch.zeros(SLOTS, dtype=torch.int32, device=device)
    return counters
