"""Compilation: the custom backend (piecewise split at attention, passes, Inductor per unique
piece, disk cache), stock torch.compile, and the counters tests and logs read."""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import torch

# Imported here, not on an engine's first compile: importing Dynamo leaves frames alive in
# reference cycles (torch.fx.wrap keeps its caller's frame), and inside LLMEngine.__init__ those
# frames would hold the engine until the garbage collector ran.
import torch._dynamo  # noqa: F401
from torch import nn

from compiled_llm.compat import allow_many_models, graph_break_count, mark_tokens_dynamic
from compiled_llm.compile.backend import BackendOptions, CompiledLLMBackend, model_factors
from compiled_llm.compile.cache import ENV_DISABLE, CompileCache, cache_key, default_cache_root
from compiled_llm.compile.counters import counters
from compiled_llm.compile.isa_probe import wait_cpu_isa_probe
from compiled_llm.compile.snapshot import snapshot_name
from compiled_llm.config import CompileConfig

__all__ = ["compile_model", "counters", "graph_break_count", "build_backend"]

PieceWrapper = Callable[[nn.Module], nn.Module]


def _pass_manager(cfg: CompileConfig):
    try:
        from compiled_llm.passes import PassConfig, PassManager
    except ImportError:  # passes land separately; the backend works without them
        return None
    return PassManager(PassConfig(**cfg.passes))


def build_backend(model: nn.Module, cfg: CompileConfig, dtype: torch.dtype,
                  piece_wrapper: PieceWrapper | None = None) -> CompiledLLMBackend:
    """The backend for one model: pass manager, cache keyed by every factor, dump dir; each
    compiled piece goes into piece_wrapper (the caller's piecewise CUDA graphs) if given."""
    passes = _pass_manager(cfg)
    use_cache = cfg.use_cache and not os.environ.get(ENV_DISABLE)
    cache = None
    if use_cache:
        factors = {**model_factors(model, dtype), "compile": cfg.mode,
                   "passes": passes.uuid() if passes is not None else "none"}
        if cfg.inductor_options():  # only then: default keys stay as they were
            factors["inductor"] = cfg.inductor_options()
        cache = CompileCache(Path(cfg.cache_dir or default_cache_root()), cache_key(factors))
        cache.write_info({"model": type(model).__name__, "dtype": str(dtype),
                          "layers": model.config.num_hidden_layers, "torch": torch.__version__})
    dump = cfg.dump_dir or os.environ.get("COMPILED_LLM_DUMP_DIR")
    return CompiledLLMBackend(BackendOptions(cache=cache, dump_dir=dump, post_grad_pass=passes,
                                             piece_wrapper=piece_wrapper,
                                             inductor_options=cfg.inductor_options()))


def compile_model(model: nn.Module, cfg: CompileConfig, dtype: torch.dtype,
                  piece_wrapper: PieceWrapper | None = None):
    """forward(input_ids, positions) compiled per cfg.mode, with T dynamic and no breaks.
    With the backend and a warm cache, the stored snapshot skips Dynamo altogether."""
    wait_cpu_isa_probe()  # else Inductor would run the probe a second time, here
    allow_many_models()
    backend = ("inductor" if cfg.mode == "stock"
               else build_backend(model, cfg, dtype, piece_wrapper))
    if isinstance(backend, CompiledLLMBackend):
        backend.snapshot_name = snapshot_name(model)
        warm = backend.load_snapshot(model)
        if warm is not None:
            return _released_with(warm, backend)
    compiled = torch.compile(model, fullgraph=True, dynamic=False, backend=backend)

    def forward(input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if cfg.dynamic_tokens:
            mark_tokens_dynamic(input_ids, positions)
        if isinstance(backend, CompiledLLMBackend):
            backend.call_started = time.perf_counter()  # Dynamo time = until the backend runs
            if not backend.captures:  # only the first capture stores a snapshot
                backend.call_locals = {"self": model, "input_ids": input_ids,
                                       "positions": positions}
        return compiled(input_ids, positions)

    if isinstance(backend, CompiledLLMBackend):
        return _released_with(forward, backend)
    forward.backend = backend
    return forward


def _released_with(forward, backend: CompiledLLMBackend):
    """forward, whose backend releases its compiled pieces and CUDA graphs when forward is
    dropped or forward.release() is called, whichever comes first (once): Dynamo and fx
    reference cycles would keep them alive long after the engine."""
    forward.backend = backend
    forward.release = weakref.finalize(forward, backend.release)
    forward.release.atexit = False  # nothing to give back at interpreter exit
    return forward
