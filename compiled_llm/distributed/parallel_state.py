"""The process groups of one multi-rank engine: all ranks (gloo on CPU, NCCL on CUDA with NVLink
multicast off, plus a gloo group for the host-side step description on CUDA) and, inside it,
one tensor-parallel group per pipeline stage: global rank = pipeline rank * TP + TP rank."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TPGroup:
    """One rank's view of the groups. `rank`, `world_size` and `group_name` (the device group
    in functional collectives, what Dynamo traces) are its tensor-parallel group's;
    `device_group` and `cpu_group` (host tensors) hold every rank, for the step broadcast."""

    rank: int
    world_size: int
    group_name: str
    device_group: dist.ProcessGroup
    cpu_group: dist.ProcessGroup
    global_rank: int = 0
    pipeline_rank: int = 0
    pipeline_size: int = 1

    @property
    def is_driver(self) -> bool:
        """Global rank 0 runs the scheduler's steps and samples; the others follow it."""
        return self.global_rank == 0


_GROUP: TPGroup | None = None
_THREADS: list[int] = []  # the thread count before a CPU group took its share


def init_tp_group(rank: int, world_size: int, init_method: str, device: torch.device,
                  timeout_s: float = 600.0, pipeline_size: int = 1) -> TPGroup:
    """Join the group of world_size ranks at init_method (a tcp:// address) as `rank`, and its
    tensor-parallel group of world_size // pipeline_size ranks; on CPU this process takes its
    share of the host's cores for its threads. One group per process: ValueError if one
    exists. timeout_s bounds one collective's wait: a peer compiling a piece between two
    collectives on a loaded 2-core CPU took over 120 s (a dead peer is caught sooner, by the
    executor's process checks)."""
    global _GROUP
    if _GROUP is not None or dist.is_initialized():
        raise ValueError("tensor_parallel_size: this process already belongs to a process group")
    # NVLink SHARP / multicast stays off, in NCCL and in torch's symmetric memory (whose
    # one-shot all-reduce reads peers' buffers over plain peer-to-peer mappings)
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:  # ranks share the host's cores: oversubscribed threads stall every collective
        _THREADS[:] = [torch.get_num_threads()]
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // world_size))
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))
    world = dist.group.WORLD
    cpu_group = dist.new_group(backend="gloo") if backend == "nccl" else world
    tp_size = world_size // pipeline_size
    tp_group = world
    if pipeline_size > 1 and tp_size > 1:  # every rank makes every stage's, in one order
        stages = [dist.new_group(list(range(first, first + tp_size)))
                  for first in range(0, world_size, tp_size)]
        tp_group = stages[rank // tp_size]
    _GROUP = TPGroup(rank % tp_size, tp_size, tp_group.group_name, world, cpu_group,
                     global_rank=rank, pipeline_rank=rank // tp_size,
                     pipeline_size=pipeline_size)
    return _GROUP


def get_tp_group() -> TPGroup | None:
    """This process's group, or None (no tensor parallelism)."""
    return _GROUP


def destroy_tp_group(group: TPGroup | None = None) -> None:
    """Leave the group (idempotent); a new one may be made after. With `group`: only while it
    is still this process's group (a dropped engine's late shutdown leaves a newer engine's
    group alone)."""
    global _GROUP
    if group is not None and _GROUP is not group:
        return
    if _GROUP is not None and dist.is_initialized():
        dist.destroy_process_group()
    _GROUP = None
    if _THREADS:
        torch.set_num_threads(_THREADS.pop())
