"""Optimization levels (-O0 ... -O3, as vLLM spells them) and performance modes: the defaults
they give to compilation, CUDA graphs, the pass list, autotuning and batching limits. They are
only defaults: a setting the user gives (compile_mode, cudagraph_mode, a `passes` entry,
max_num_seqs ...) wins, one field at a time. Also the switch of side-by-side piece compiles."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

OptimizationLevel = Literal[0, 1, 2, 3]
PerformanceMode = Literal["balanced", "interactivity", "throughput"]

# every fusion pass's flag (passes/manager.py PassConfig); -O0 compiles nothing, so they are off
_FUSIONS = ("enable_noop", "enable_rms_norm", "enable_silu_mul",
            "enable_fp8_quant_fusion", "enable_allreduce_rms", "enable_horizontal_gemm",
            "enable_small_m_gemm", "enable_silu_mul_small_m", "enable_small_m_silu_mul",
            "enable_small_m_add_rms_norm", "enable_small_m_norm_prologue",
            "enable_qk_norm_rope_kv_write")


@dataclass(frozen=True)
class LevelDefaults:
    """What one optimization level sets when the user leaves the field unset."""

    compile_mode: str
    cudagraph_mode: str
    passes: dict = field(default_factory=dict)  # PassConfig overrides
    max_autotune: bool = False


LEVELS: dict[int, LevelDefaults] = {
    # eager: fastest start-up, for debugging
    0: LevelDefaults("none", "none", dict.fromkeys(_FUSIONS, False)),
    # compiled with every (cheap) fusion, piecewise CUDA graphs only: shorter capture
    1: LevelDefaults("backend", "piecewise"),
    # the default: -O1 plus full CUDA graphs of whole decode steps
    2: LevelDefaults("backend", "full_and_piecewise"),
    # -O2 plus Inductor's GEMM autotuning (Triton templates against ATen) when compiling
    3: LevelDefaults("backend", "full_and_piecewise", max_autotune=True),
}

# Inductor options that -O3's max_autotune turns on
AUTOTUNE_OPTIONS = {"max_autotune": True, "max_autotune_gemm": True,
                    "max_autotune_gemm_backends": "ATEN,TRITON"}


@dataclass(frozen=True)
class ModeDefaults:
    """What one performance mode sets when the user leaves the field unset."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    fine_graph_sizes: bool = False  # a full CUDA graph for every batch size up to 32


PERFORMANCE_MODES: dict[str, ModeDefaults] = {
    "balanced": ModeDefaults(),
    # small batches: a graph per size (no padding), short prefill chunks (steady decode steps)
    "interactivity": ModeDefaults(max_num_batched_tokens=2048, fine_graph_sizes=True),
    # high concurrency: more sequences and longer steps
    "throughput": ModeDefaults(max_num_seqs=512, max_num_batched_tokens=16384),
}


# `serve`'s token budget in balanced mode when none is given (LLM keeps the mode's 8192), with
# piecewise CUDA graphs up to it: a step that carries prompt chunks beside 256 decodes then
# lasts at most about 3x a decode step (ITL p99 / p50 3.0 against 5.4 at 8192, at 0.90x
# against 0.99x of offline throughput: docs/benchmarks.md, calls 39-40)
SERVE_MAX_NUM_BATCHED_TOKENS = 2048


def level_defaults(level: int) -> LevelDefaults:
    """The defaults of optimization level `level` (0-3); ValueError naming the field."""
    if level not in LEVELS:
        raise ValueError(f"optimization_level must be one of {sorted(LEVELS)}, got {level!r}")
    return LEVELS[level]


def mode_graph_sizes(mode: str, max_num_seqs: int | None) -> list[int] | None:
    """The full-graph batch sizes performance mode `mode` asks for: None (the runner's default
    for its max_num_seqs), or with fine sizes every size 1..32, then every 16 up to
    max_num_seqs (and max_num_seqs itself)."""
    defaults = PERFORMANCE_MODES[mode]
    if not defaults.fine_graph_sizes:
        return None
    seqs = defaults.max_num_seqs if max_num_seqs is None else max_num_seqs
    sizes = set(range(1, min(32, seqs) + 1)) | set(range(48, seqs + 1, 16))
    return sorted({*sizes, seqs})


# the backend's pieces compiled in warm compile children (compile/side_compile.py): 0 off,
# 1 also on the CPU; unset: on CUDA only
ENV_SIDE_PIECE_COMPILE = "COMPILED_LLM_SIDE_PIECE_COMPILE"
_OFF = ("0", "false", "off", "no")


def side_piece_compile_wanted(device_type: str) -> bool:
    """Whether cold starts on device_type compile their pieces in warm compile children."""
    value = os.environ.get(ENV_SIDE_PIECE_COMPILE, "").strip().lower()
    if value in _OFF:
        return False
    return device_type == "cuda" or value in ("1", "true", "on", "yes")
