"""Host-to-device copies on the step path that never make the host wait: the data goes to
pinned host memory (on CUDA) and is copied with non_blocking=True. A pageable or blocking copy
makes torch synchronize the stream, which waits for the forward in flight and so ends the
overlap of host and device that async scheduling is for."""

from __future__ import annotations

import numpy as np
import torch


def _pin(device: torch.device) -> bool:
    return device.type == "cuda"


def upload(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """values (a list, nested lists or a numpy array) as a tensor on device, copied from
    pinned host memory without blocking."""
    if isinstance(values, np.ndarray):
        host = torch.from_numpy(values).to(dtype)
        if _pin(device):
            host = host.pin_memory()
    else:
        host = torch.tensor(values, dtype=dtype, pin_memory=_pin(device))
    return host.to(device, non_blocking=True)


def host_full(shape: tuple[int, ...], value: int, dtype: torch.dtype,
              device: torch.device) -> torch.Tensor:
    """A host tensor to fill and then send to device with send(): pinned when device is CUDA."""
    return torch.full(shape, value, dtype=dtype, pin_memory=_pin(device))


def send(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor from host_full on device, without blocking (the caching host allocator
    keeps the pinned block until the copy is done)."""
    return host.to(device, non_blocking=True)
