"""A rank's KV-cache budget in blocks of its own layers: a byte budget on CPU, its share of
the device on GPU (gpu_memory_utilization less its weights and peak activations), read once
the profiling forward has run."""

from __future__ import annotations

import torch

from compiled_llm.worker.model_runner import ModelRunner

_HEADROOM = 2 << 30  # bytes kept free beyond the KV cache for graphs and sampling


def budget_blocks(runner: ModelRunner, baseline: int = 0) -> int:
    """Blocks of this runner's layers that its budget holds, once the profiling forward has
    run (every rank computes its own: pipeline stages hold different layers)."""
    cfg = runner.cache_cfg
    if cfg.num_gpu_blocks_override:
        return cfg.num_gpu_blocks_override
    per_block = runner.kv_bytes_per_block()
    if cfg.kv_cache_memory_bytes is not None:
        budget = cfg.kv_cache_memory_bytes
    elif runner.device.type == "cuda":
        budget = gpu_budget(cfg.gpu_memory_utilization, baseline)
    else:
        budget = 1 << 30
    blocks = budget // per_block
    if blocks < 2:
        raise ValueError(f"KV cache budget of {budget} bytes holds fewer than 2 blocks")
    return int(blocks)


def gpu_budget(utilization: float, baseline: int) -> int:
    """This engine's share of the device less its own weights and peak activations, and never
    more than is free now (another engine or process may hold the rest)."""
    free, total = torch.cuda.mem_get_info()
    cached = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    own = torch.cuda.max_memory_allocated() - baseline
    # what is free now, less room for this engine's CUDA graphs and sampler: the headroom that
    # `utilization` implies, but at most _HEADROOM, so a second engine beside the first (each
    # 0.4 of the device, say) still gets its share
    headroom = min(int(total * (1 - utilization)), _HEADROOM)
    return min(int(total * utilization) - own, free + cached - headroom)
