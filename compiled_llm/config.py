"""Engine configuration dataclasses: cache, scheduler and compile settings in one place."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

ENV_KV_BYTES = "COMPILED_LLM_KV_CACHE_MEMORY_BYTES"  # default KV budget, CPU and GPU alike


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


@dataclass
class CacheConfig:
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_bytes: int | None = None  # CPU budget (and a GPU override)
    num_gpu_blocks_override: int | None = None

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 2048
    enable_chunked_prefill: bool = True
    scheduling_policy: str = "fcfs"  # or "priority"

    def __post_init__(self) -> None:
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(
                f"scheduling_policy must be fcfs or priority, got {self.scheduling_policy!r}"
            )
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                "max_num_batched_tokens must be >= max_model_len without chunked prefill"
            )


@dataclass
class CompileConfig:
    """How the model is compiled: `mode` is "backend" (ours: piecewise, passes, cache),
    "stock" (plain torch.compile with Inductor) or "none" (eager)."""

    mode: str = "backend"
    dynamic_tokens: bool = True
    cache_dir: str | None = None  # default: $COMPILED_LLM_CACHE_DIR or ~/.cache/compiled_llm
    use_cache: bool = True
    dump_dir: str | None = None  # default: $COMPILED_LLM_DUMP_DIR
    passes: dict = field(default_factory=dict)  # PassConfig overrides: {"enable_silu_mul": False}
    cudagraph_mode: str = "full_and_piecewise"  # none | piecewise | full | full_and_piecewise
    cudagraph_batch_sizes: list[int] | None = None
    piecewise_max_tokens: int = 512

    def __post_init__(self) -> None:
        if self.mode not in ("backend", "stock", "none"):
            raise ValueError(f"compile_mode must be backend, stock or none, got {self.mode!r}")
        modes = ("none", "piecewise", "full", "full_and_piecewise")
        if self.cudagraph_mode not in modes:
            raise ValueError(f"cudagraph_mode must be one of {modes}, got {self.cudagraph_mode!r}")


@dataclass
class EngineArgs:
    """Everything LLM(...) and `compiled-llm` accept; `build()` derives the sub-configs."""

    model: str | None = None
    tokenizer: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_bytes: int | None = field(default_factory=lambda: _env_int(ENV_KV_BYTES))
    num_gpu_blocks_override: int | None = None
    enforce_eager: bool = False
    compile_mode: str = "backend"
    compile_cache_dir: str | None = None
    dump_dir: str | None = None
    passes: dict = field(default_factory=dict)
    cudagraph_mode: str = "full_and_piecewise"
    cudagraph_batch_sizes: list[int] | None = None
    enable_chunked_prefill: bool = True
    load_format: str = "auto"
    quantization: str | None = None  # None or "fp8" (W8A8, weights quantized at load)
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: str = "xxhash"  # or "sha256"
    scheduling_policy: str = "fcfs"  # or "priority": lower request priority value runs first
    # schedule and launch step N+1 before reading step N's tokens, so host work overlaps the
    # device (requests whose sampling needs the previous token on the host run step by step)
    async_scheduling: bool = False
    seed: int = 0
    skip_tokenizer_init: bool = False
    attention_backend: str = "auto"  # "auto": triton on CUDA, torch elsewhere

    def attention_backend_for(self, device_type: str) -> str:
        if self.attention_backend == "auto":
            return "triton" if device_type == "cuda" else "torch"
        return self.attention_backend

    def scheduler_config(self, model_max_len: int) -> SchedulerConfig:
        max_len = self.max_model_len or model_max_len
        if max_len > model_max_len:
            raise ValueError(
                f"max_model_len {max_len} exceeds the model's max_position_embeddings "
                f"{model_max_len}"
            )
        tokens = self.max_num_batched_tokens or max(8192, 0 if self.enable_chunked_prefill
                                                    else max_len)
        return SchedulerConfig(self.max_num_seqs, tokens, max_len, self.enable_chunked_prefill,
                               self.scheduling_policy)

    def __post_init__(self) -> None:
        from compiled_llm.core.prefix_hash import hash_fn

        hash_fn(self.prefix_caching_hash_algo)  # ValueError naming the field if unknown

    def cache_config(self) -> CacheConfig:
        return CacheConfig(self.block_size, self.gpu_memory_utilization,
                           self.kv_cache_memory_bytes, self.num_gpu_blocks_override)

    def compile_config(self) -> CompileConfig:
        return CompileConfig(
            mode="none" if self.enforce_eager else self.compile_mode,
            cache_dir=self.compile_cache_dir, dump_dir=self.dump_dir, passes=dict(self.passes),
            cudagraph_mode="none" if self.enforce_eager else self.cudagraph_mode,
            cudagraph_batch_sizes=self.cudagraph_batch_sizes)
