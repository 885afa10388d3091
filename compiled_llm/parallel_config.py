"""The EngineArgs fields of parallelism (vLLM's spellings): tensor and pipeline parallel sizes,
expert parallelism and the executor that runs the ranks; validated when EngineArgs is made."""

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
    """Pipeline stages: the decoder's layers split into this many contiguous stages, one
    process and device each (vLLM's split; VLLM_PP_LAYER_PARTITION sets it by hand). The
    stages of a step run one after another (no micro-batches in flight); not with
    tensor_parallel_size > 1 yet."""
    enable_expert_parallel: bool = False
    """Mixture-of-experts layers hold whole experts per rank (num_experts / tensor_parallel_size
    each, the router replicated) instead of a slice of every expert; needs
    tensor_parallel_size > 1."""
    distributed_executor_backend: ExecutorBackend | None = None
    """How ranks run: uni (one rank, in the engine's process), mp (a process per rank beside
    the engine's, which holds rank 0) or ray (Ray actors for ranks 1..N-1, one host) (default:
    uni for one rank, mp for more)."""

    def check_parallel(self) -> None:
        """ValueError naming the field for a size or backend the engine cannot run."""
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            size = getattr(self, name)
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"{name} must be an int >= 1, got {size!r}")
        if not isinstance(self.enable_expert_parallel, bool):
            raise ValueError(f"enable_expert_parallel must be a bool, got "
                             f"{self.enable_expert_parallel!r}")
        if self.enable_expert_parallel and self.tensor_parallel_size == 1:
            raise ValueError("enable_expert_parallel needs tensor_parallel_size > 1 (the experts "
                             "are split over the tensor-parallel ranks)")
        if self.distributed_executor_backend == "uni" and self.world_size > 1:
            raise ValueError(f'distributed_executor_backend "uni" runs one rank; '
                             f"{self.parallel_field} {self.world_size} needs \"mp\"")

    def check_parallel_combinations(self) -> None:
        """ValueError naming tensor_parallel_size or pipeline_parallel_size with a feature
        that does not run over several ranks yet (LoRA, speculative decoding, quantization)."""
        if self.world_size == 1:
            return
        field = self.parallel_field
        for name in ("enable_lora", "speculative_config", "quantization"):
            if getattr(self, name, None):
                raise ValueError(f"{field} {self.world_size} with {name}: not supported "
                                 f"together yet; use {field} 1")
        # an FP8 cache without checkpoint scales is calibrated on the first step by the
        # driver's forward alone: the other stages' layers would keep scales of 1
        kv_dtype = str(getattr(self, "kv_cache_dtype", "auto"))
        if self.pipeline_parallel_size > 1 and kv_dtype.startswith("fp8"):
            raise ValueError(f"pipeline_parallel_size {self.pipeline_parallel_size} with "
                             f"kv_cache_dtype {kv_dtype!r}: not supported together yet; use "
                             "kv_cache_dtype auto")

    @property
    def world_size(self) -> int:
        """Ranks in all: one process and device each."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def parallel_field(self) -> str:
        """The field that asks for several ranks (errors name it)."""
        return "pipeline_parallel_size" if self.pipeline_parallel_size > 1 \
            else "tensor_parallel_size"

    @property
    def executor_backend(self) -> str:
        """The backend that runs the ranks: the one given, else uni for one rank, else mp."""
        if self.distributed_executor_backend is not None:
            return self.distributed_executor_backend
        return "uni" if self.world_size == 1 else "mp"
