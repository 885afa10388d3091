"""WorkerSpec, apart from the worker: a front end builds one (and pickles it to a core
process) without importing the worker's stack (the model runner, the compiler, Dynamo)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from compiled_llm.config import SchedulerConfig


@dataclass
class WorkerSpec:
    """What a worker needs besides EngineArgs, resolved once by the engine."""

    model_dir: str
    dtype: torch.dtype
    device: torch.device
    scheduler: SchedulerConfig
