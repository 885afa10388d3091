"""The EngineArgs fields of parallelism (vLLM's spellings): tensor and pipeline parallel sizes
and the executor that runs the ranks; validated when EngineArgs is made."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal

from compiled_llm.pooling_params import RunnerArgs

ExecutorBackend = Literal["uni", "mp", "ray"]
EXECUTOR_BACKENDS: tuple[str, ...] = typing.get_args(ExecutorBackend)


@dataclass
class ParallelArgs(RunnerArgs):
    """Parallelism settings; EngineArgs inherits them (and RunnerArgs through them)."""

    tensor_parallel_size: int = 1
    """Ranks each layer's weights are sharded over (one process and device per rank): q/k/v
    and gate/up by rows, o/down by columns, embedding and LM head by vocab."""
    pipeline_parallel_size: int = 1
    """Pipeline stages (layers split over ranks); only 1 is supported."""
    distributed_executor_backend: ExecutorBackend | None = None
    """How ranks run: uni (one rank, in the engine's process), mp (a process per rank beside
    the engine's, which holds rank 0) or ray (Ray actors for ranks 1..N-1, one host) (default:
    uni for one rank, mp for more)."""

    def check_parallel(self) -> None:
        """ValueError naming the field for a size or backend the engine cannot run."""
        size = self.tensor_parallel_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"tensor_parallel_size must be an int >= 1, got {size!r}")
        if self.pipeline_parallel_size != 1:
            raise ValueError("pipeline_parallel_size must be 1: pipeline parallelism is not "
                             f"supported (got {self.pipeline_parallel_size!r})")
        backend = self.distributed_executor_backend
        if backend == "uni" and size > 1:
            raise ValueError(f'distributed_executor_backend "uni" runs one rank; '
                             f"tensor_parallel_size {size} needs \"mp\"")

    def check_parallel_combinations(self) -> None:
        """ValueError naming tensor_parallel_size with a feature that does not run sharded yet
        (LoRA, speculative decoding, quantization)."""
        if self.tensor_parallel_size == 1:
            return
        for name in ("enable_lora", "speculative_config", "quantization"):
            if getattr(self, name, None):
                raise ValueError(f"tensor_parallel_size {self.tensor_parallel_size} with {name}: "
                                 "not supported together yet; use tensor_parallel_size 1")

    @property
    def executor_backend(self) -> str:
        """The backend that runs the ranks: the one given, else uni for one rank, else mp."""
        if self.distributed_executor_backend is not None:
            return self.distributed_executor_backend
        return "uni" if self.tensor_parallel_size == 1 else "mp"
