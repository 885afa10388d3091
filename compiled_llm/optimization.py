"""Optimization levels (-O0 ... -O3, as vLLM spells them) and performance modes: the defaults
they give to compilation, CUDA graphs, the pass list, autotuning and batching limits. They are
only defaults: a setting the user gives (compile_mode, cudagraph_mode, a `passes` entry,
max_num_seqs ...) wins, one field at a time. Also the switch of side-by-side piece compiles,
and vLLM's compilation_config read into those same fields (each key mapped, or refused)."""

from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass, field
from typing import Any, Literal

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


# vLLM's CompilationMode (and the older CompilationLevel) by number and by name
_MODES = ("none", "stock", "stock", "backend")
_MODE_NAMES = {"NONE": 0, "STOCK_TORCH_COMPILE": 1, "DYNAMO_TRACE_ONCE": 2, "VLLM_COMPILE": 3,
               "NO_COMPILATION": 0, "DYNAMO_AS_IS": 1, "DYNAMO_ONCE": 2, "PIECEWISE": 3}
# this engine's full graphs cover pure-decode steps: FULL's mixed steps run without them
_GRAPH_MODES = {"NONE": "none", "PIECEWISE": "piecewise", "FULL": "full",
                "FULL_DECODE_ONLY": "full", "FULL_AND_PIECEWISE": "full_and_piecewise"}
# vLLM's pass_config names (0.11 and the newer fuse_* ones) -> PassConfig's flags here
_PASS_NAMES = {"enable_noop": "enable_noop", "eliminate_noops": "enable_noop",
               "enable_fusion": "enable_fp8_quant_fusion",
               "fuse_norm_quant": "enable_fp8_quant_fusion",
               "fuse_act_quant": "enable_fp8_quant_fusion",
               "enable_fi_allreduce_fusion": "enable_allreduce_rms",
               "fuse_allreduce_rms": "enable_allreduce_rms",
               "enable_qk_norm_rope_fusion": "enable_qk_norm_rope_kv_write"}
# passes this engine does not have: only false (or absent) is accepted
_NO_PASSES = ("enable_attn_fusion", "fuse_attn_quant", "enable_sequence_parallelism", "enable_sp",
              "enable_async_tp", "fuse_gemm_comms")
# keys that ask for nothing at these values: the value this engine always runs with
_ALWAYS = {"use_inductor": (True,), "backend": ("", "inductor"), "use_cudagraph": (True,),
           "compile_sizes": ([],), "splitting_ops": (None,), "custom_ops": ([],),
           "inductor_passes": ({},),
           "compile_cache_save_format": ("binary", "unpacked")}  # the cache has its own format
_FIELDS = {"debug_dump_path": "dump_dir", "cache_dir": "compile_cache_dir",
           "max_cudagraph_capture_size": "max_cudagraph_capture_size"}


class CompilationConfig:
    """vLLM's `CompilationConfig(mode=3, cudagraph_capture_sizes=[...], ...)` spelling of
    compilation_config: the keywords given are read as the dict's keys are (None: unset), and
    what this engine cannot honour is refused by name when the engine arguments are built."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def __repr__(self) -> str:
        return f"CompilationConfig({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


def as_dict(value: Any) -> dict:
    """compilation_config as a dict: an int (or digits) is its mode, a string JSON, an object
    its public attributes but those set to None."""
    if isinstance(value, str):
        value = int(value) if value.strip().isdigit() else _json(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return {"mode": value}
    if isinstance(value, dict):
        return value
    if not hasattr(value, "__dict__") or isinstance(value, type):
        raise ValueError(f"compilation_config must be a mode (0-3), a dict, a JSON object or a "
                         f"CompilationConfig-like object, got {value!r}")
    return {k: _plain(v) for k, v in vars(value).items()
            if not k.startswith("_") and v is not None}


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"compilation_config: not an int or a JSON object ({e}): {text!r}"
                         ) from None


def _plain(value: Any) -> Any:
    if hasattr(value, "__dict__") and not isinstance(value, type | int | str | enum.Enum):
        return as_dict(value)  # a nested PassConfig-like object
    return value


def _name(value: Any) -> Any:
    """An enum member as its name (CUDAGraphMode.FULL -> "FULL"); other values as they are."""
    name = getattr(value, "name", None)
    return name if isinstance(name, str) and not isinstance(value, int) else value


def _mode(key: str, value: Any) -> str:
    number = value
    if isinstance(value, str) and value.strip().isdigit():
        number = int(value)
    elif not isinstance(value, int):
        number = _MODE_NAMES.get(str(_name(value)).upper())
    if isinstance(number, bool) or number not in range(len(_MODES)):
        raise ValueError(f"compilation_config.{key} must be 0-3 or one of {list(_MODE_NAMES)}, "
                         f"got {value!r}")
    return _MODES[int(number)]


def _graph_mode(value: Any) -> str:
    mode = _GRAPH_MODES.get(str(_name(value)).upper())
    if mode is None:
        raise ValueError(f"compilation_config.cudagraph_mode must be one of "
                         f"{list(_GRAPH_MODES)}, got {value!r}")
    return mode


def _passes(pass_config: Any) -> dict:
    """pass_config as PassConfig overrides: vLLM's names mapped, this engine's own taken."""
    own = {*_FUSIONS, "small_m_gemm_on_cpu", "qk_norm_rope_kv_write_on_cpu", "inline_fused_ops"}
    out: dict = {}
    for key, value in as_dict(pass_config).items():
        if key in _NO_PASSES:
            if value:
                raise ValueError(f"compilation_config.pass_config.{key}: not supported (this "
                                 "engine has no such pass)")
            continue
        flag = _PASS_NAMES.get(key, key if key in own else None)
        if flag is None:
            raise ValueError(f"compilation_config.pass_config.{key}: unknown pass; known: "
                             f"{sorted({*_PASS_NAMES, *_NO_PASSES, *own})}")
        if out.get(flag, value) != value:
            raise ValueError(f"compilation_config.pass_config.{key}={value!r} contradicts "
                             f"another key that sets {flag}={out[flag]!r}")
        out[flag] = bool(value)
    return out


def _autotune(options: Any) -> dict:
    options = dict(options or {})
    if set(options) - {"max_autotune"}:
        raise ValueError(f"compilation_config.inductor_compile_config: only max_autotune is "
                         f"supported, got {sorted(options)}")
    return {"max_autotune": bool(options["max_autotune"])} if options else {}


def engine_fields(value: Any) -> dict:
    """{EngineArgs field: value} that compilation_config asks for; ValueError naming the key
    this engine cannot honour."""
    config, out = as_dict(value), {}
    for key, item in config.items():
        if key in ("mode", "level"):
            mode = _mode(key, item)
            if out.setdefault("compile_mode", mode) != mode:
                raise ValueError("compilation_config: mode and level disagree")
        elif key == "cudagraph_mode":
            out["cudagraph_mode"] = _graph_mode(item)
        elif key == "cudagraph_capture_sizes":
            sizes = sorted({int(size) for size in item})
            out["cudagraph_batch_sizes"] = sizes or None
            out.setdefault("max_cudagraph_capture_size", max(sizes, default=None))
        elif key == "pass_config":
            out["passes"] = _passes(item)
        elif key == "inductor_compile_config":
            out.update(_autotune(item))
        elif key in _FIELDS:
            out[_FIELDS[key]] = item
        elif key == "use_cudagraph" and item is False:
            out["cudagraph_mode"] = "none"
        elif key not in _ALWAYS:
            if item not in (None, False, 0, "", [], {}, ()):  # else it asks for nothing
                raise ValueError(f"compilation_config.{key}: not supported by compiled-llm")
        elif item not in _ALWAYS[key] and item is not None:
            raise ValueError(f"compilation_config.{key}={item!r}: not supported by compiled-llm "
                             f"(accepted: {list(_ALWAYS[key])})")
    return {k: v for k, v in out.items() if v is not None}


def apply_compilation_config(args: Any) -> None:
    """Set EngineArgs' compile fields from args.compilation_config and from vLLM 0.11's
    cuda_graph_sizes (one value N: graphs up to N; several: the capture list), then clear both
    (so building args again is the same); ValueError where a field given says otherwise."""
    sizes = args.cuda_graph_sizes
    if sizes is not None:
        sizes = [sizes] if isinstance(sizes, int) else list(sizes)
        key = "max_cudagraph_capture_size" if len(sizes) == 1 else "cudagraph_capture_sizes"
        _set_fields(args, engine_fields({key: sizes[0] if len(sizes) == 1 else sizes}),
                    "cuda_graph_sizes")
        args.cuda_graph_sizes = None
    if args.compilation_config is not None:
        _set_fields(args, engine_fields(args.compilation_config), "compilation_config")
        args.compilation_config = None


def _set_fields(args: Any, fields: dict, source: str) -> None:
    for name, value in fields.items():
        current = getattr(args, name)
        if name == "passes":
            clash = sorted(k for k in value if k in current and current[k] != value[k])
            value = {**current, **value}
        else:
            clash = current is not None and current != value
        if clash:
            raise ValueError(f"{source} sets {name}={value!r}, but {name} is also given as "
                             f"{current!r}")
        setattr(args, name, value)


def compilation_config_arg(text: str) -> dict:
    """argparse type of --compilation-config / -cc: a mode (0-3) or a JSON object."""
    import argparse

    try:
        value = as_dict(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be 0-3 or a JSON object, got {text!r}")
    return value
