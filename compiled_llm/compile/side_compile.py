"""Pieces compiled by Inductor in compile children, side by side, on a cold start: the backend
hands each uncached unique piece (its graph pickled with its symbolic example values) to a
child whose Inductor is already warm, and loads the artifact the child stores in the compile
cache. The parent's own first Inductor compile (about 3 s of one-time set-up on the H200) and
the pieces' serial compiles leave the critical path. Any failure falls back to compiling here.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import importlib
import logging
import os
import pickle
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import torch
from torch import fx

from compiled_llm.optimization import ENV_SIDE_PIECE_COMPILE as ENV  # noqa: F401 (the switch)
from compiled_llm.optimization import side_piece_compile_wanted as wanted  # noqa: F401

TIMEOUT_S = 300.0  # the longest the backend waits for one piece's child
# packages whose modules register the custom ops that pieces may hold
_OP_PACKAGES = ("compiled_llm.attention", "compiled_llm.gemm", "compiled_llm.lora",
                "compiled_llm.moe", "compiled_llm.quantization", "compiled_llm.passes",
                "compiled_llm.models")
logger = logging.getLogger(__name__)


class PieceCompiler(Protocol):
    """What the backend needs of the children: hand over a job, later its answer."""

    def submit_piece(self, path: str) -> int:
        """Queue the piece job stored at path; returns its id."""

    def piece_answer(self, job_id: int, timeout_s: float) -> dict | None:
        """The child's answer ({"ok", "error", "seconds", "passes"}), or None if none came."""


_current: contextvars.ContextVar[PieceCompiler | None] = contextvars.ContextVar(
    "side_piece_compiler", default=None)


@contextlib.contextmanager
def using(compiler: PieceCompiler) -> Iterator[None]:
    """Within: the backend's cold compiles go to compiler's children."""
    token = _current.set(compiler)
    try:
        yield
    finally:
        _current.reset(token)


def current() -> PieceCompiler | None:
    """The children the backend may use now, if any."""
    return _current.get()


# ---------------------------------------------------------------- parent side
def _fresh(value):
    """value with each fake tensor replaced by a plain one of its size, stride and dtype (a
    view's base and view function do not pickle); symbolic sizes are kept."""
    if isinstance(value, torch.Tensor):
        with value.fake_mode:
            return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype,
                                       device=value.device)
    if isinstance(value, (list, tuple)):
        return type(value)(_fresh(item) for item in value)
    return value


def portable_graph(module: fx.GraphModule) -> fx.GraphModule:
    """A copy of a piece whose nodes keep only their example values, made picklable."""
    graph, env = fx.Graph(), {}
    for node in module.graph.nodes:
        copy = env[node] = graph.node_copy(node, lambda arg: env[arg])
        value = node.meta.get("example_value", node.meta.get("val"))
        copy.meta = {}
        if value is not None:
            copy.meta["example_value"] = _fresh(value)
            if node.op == "placeholder":
                copy.meta["val"] = copy.meta["example_value"]
    return fx.GraphModule(module, graph)


def write_job(module: fx.GraphModule, piece_key: str, cache_dir: Path, passes,
              inductor_options: dict | None) -> str:
    """Store one piece's job (graph, cache entry, passes, Inductor patches) in a temporary
    file; its path (the caller removes it)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx._graph_pickler import GraphPickler, Options

    with unset_fake_temporarily():  # every op: the child imports the modules that define ours
        graph = GraphPickler.dumps(portable_graph(module), Options(ops_filter=None))
    job = {"graph": graph, "piece_key": piece_key, "cache_dir": str(cache_dir),
           "passes": None if passes is None else dataclasses.asdict(passes.config),
           "inductor_options": dict(inductor_options or {}),
           "modules": sorted(name for name in sys.modules if name.startswith(_OP_PACKAGES))}
    fd, path = tempfile.mkstemp(prefix="compiled-llm-", suffix=".piece")
    try:
        with os.fdopen(fd, "wb") as out:
            pickle.dump(job, out)
    except BaseException:
        os.unlink(path)
        raise
    return path


# ---------------------------------------------------------------- child side
def compile_job(path: str) -> dict:
    """Compile the piece job at path with Inductor and store it in the compile cache (the
    parent loads it from there); the answer's seconds and pass statistics."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx._graph_pickler import GraphPickler
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from compiled_llm.compile.cache import CompileCache

    with open(path, "rb") as job_file:
        job = pickle.load(job_file)
    for name in job["modules"]:  # the custom ops the graph may call
        with contextlib.suppress(Exception):  # one the graph needs fails its unpickling
            importlib.import_module(name)
    began = time.perf_counter()
    module = GraphPickler.loads(job["graph"], FakeTensorMode(shape_env=ShapeEnv()))
    patches = dict(job["inductor_options"])
    manager = _pass_manager(job["passes"])
    if manager is not None:
        patches["post_grad_custom_post_pass"] = manager
    with torch._inductor.config.patch(patches):
        artifact = torch._inductor.standalone_compile(
            module, _example_values(module), dynamic_shapes="from_graph")
    cache_dir = Path(job["cache_dir"])
    cache = CompileCache(cache_dir.parent, cache_dir.name)
    with cache.lock():
        cache.save(job["piece_key"], artifact, {"piece": "side"})
    stats = [] if manager is None else list(manager.last_stats)
    return {"seconds": time.perf_counter() - began, "passes": stats}


def _pass_manager(fields: dict | None):
    if fields is None:
        return None
    from compiled_llm.passes import PassConfig, PassManager

    return PassManager(PassConfig(**fields))


def _example_values(module: fx.GraphModule) -> list:
    return [node.meta["val"] for node in module.graph.nodes if node.op == "placeholder"]


def warm_up(device: str) -> None:
    """One small compile on device, so that Inductor's one-time set-up (its pattern tables,
    code hashes, backend imports, the compile workers) is done before the first piece."""
    import compiled_llm.passes  # noqa: F401 (the pass manager's imports)

    def sample(hidden, weight):
        scores = torch.nn.functional.silu(hidden @ weight)
        return scores * torch.rsqrt(scores.pow(2).mean(-1, keepdim=True) + 1e-6)

    dtype = torch.bfloat16 if device != "cpu" else torch.float32
    args = [torch.randn(8, 64, dtype=dtype, device=device),
            torch.randn(64, 64, dtype=dtype, device=device)]
    torch._inductor.standalone_compile(fx.symbolic_trace(sample), args,
                                       dynamic_shapes="from_example_inputs")
