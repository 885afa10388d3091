"""The compiled-llm torch.compile backend.

Dynamo graph -> split at attention -> for each unique piece: passes + Inductor (or the disk
cache) -> a split graph whose compute pieces are compiled and whose attention ops run eagerly.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import fx, nn

from compiled_llm.compile.cache import CompileCache
from compiled_llm.compile.counters import counters
from compiled_llm.compile.dump import PieceDumper
from compiled_llm.compile.piecewise import PiecewiseGraphPiece
from compiled_llm.compile.split import Piece, piece_hash, split_graph

logger = logging.getLogger(__name__)


@dataclass
class BackendOptions:
    cache: CompileCache | None = None
    dump_dir: str | None = None
    post_grad_pass: object = None  # a CustomGraphPass run by Inductor after its own passes
    inductor_options: dict | None = None
    piecewise_cudagraphs: bool = False


class CompiledPiece(nn.Module):
    """A compiled piece in place of its GraphModule; same call signature and outputs."""

    def __init__(self, fn, key: str, returns_tuple: bool) -> None:
        super().__init__()
        self.fn, self.key, self.returns_tuple = fn, key, returns_tuple

    def forward(self, *args):
        out = self.fn(*args)
        # a loaded artifact returns a flat list even where the graph returned one value
        if isinstance(out, (list, tuple)):
            return tuple(out) if self.returns_tuple else out[0]
        return out


class CompiledLLMBackend:
    """Callable handed to torch.compile(backend=...). Keeps compiled pieces by hash, so the
    repeated layer compiles once and a recapture reuses everything."""

    def __init__(self, opts: BackendOptions) -> None:
        self.opts = opts
        self.compiled: dict[str, object] = {}
        self.call_started: float | None = None
        self.captures = 0
        self.dumper = PieceDumper(opts.dump_dir) if opts.dump_dir else None

    def __call__(self, gm: fx.GraphModule, example_inputs: list) -> fx.GraphModule:
        t0 = time.perf_counter()
        counters.graphs_captured += 1
        self.captures += 1
        counters.recompiles += int(self.captures > 1)
        if self.call_started is not None:
            counters.add_time("dynamo", t0 - self.call_started)
        split, pieces = split_graph(gm)
        counters.add_time("split", time.perf_counter() - t0)
        # the placeholders' fake values carry the symbolic T; example_inputs are real tensors
        fakes = [_fake_value(n) for n in gm.graph.nodes if n.op == "placeholder"]
        mode = next(f.fake_mode for f in fakes if isinstance(f, torch.Tensor))
        with mode:
            _PieceCompiler(split, self, {p.name: p for p in pieces}).run(*fakes)
        return split

    def compile_piece(self, piece: Piece, args: list) -> object:
        """Compiled callable for a piece: reuse by hash, else the cache, else Inductor."""
        counters.pieces += 1
        key = piece_hash(piece.module)
        if key in self.compiled:
            return self.compiled[key]
        counters.unique_pieces += 1
        fn = self._load_or_compile(key, piece, args)
        self.compiled[key] = fn
        return fn

    def _load_or_compile(self, key: str, piece: Piece, args: list):
        cache = None if self.dumper else self.opts.cache  # a dump needs a real compile
        if cache is None:
            return self._inductor(key, piece, args)
        with cache.lock():
            t0 = time.perf_counter()
            fn = cache.load(key)
            counters.add_time("cache_load", time.perf_counter() - t0)
            if fn is None:
                fn = self._inductor(key, piece, args)
                cache.save(key, fn, {"piece": piece.name})
        return fn

    def _inductor(self, key: str, piece: Piece, args: list):
        patches = dict(self.opts.inductor_options or {})
        if self.opts.post_grad_pass is not None:
            patches["post_grad_custom_post_pass"] = self.opts.post_grad_pass
        t0 = time.perf_counter()
        dump = self.dumper.piece(key, piece, self.opts.post_grad_pass) if self.dumper \
            else contextlib.nullcontext()
        with dump, torch._inductor.config.patch(patches):
            fn = torch._inductor.standalone_compile(piece.module, args, dynamic_shapes="from_graph")
        counters.inductor_compiles += 1
        counters.add_time("inductor", time.perf_counter() - t0)
        for name, matches, secs in getattr(self.opts.post_grad_pass, "last_stats", []):
            counters.add_matches(name, matches)
            counters.add_time(f"pass {name}", secs)
        return fn


class _PieceCompiler(fx.Interpreter):
    """Runs the split graph on fake inputs, compiling each compute piece as it is reached
    (so each gets example inputs of the right symbolic shapes)."""

    def __init__(self, split: fx.GraphModule, backend: CompiledLLMBackend, pieces) -> None:
        super().__init__(split)
        self.split, self.backend, self.pieces = split, backend, pieces

    def call_module(self, target, args, kwargs):
        out = super().call_module(target, args, kwargs)
        piece = self.pieces.get(target)
        if piece is not None and not piece.is_split_op:
            fn = self.backend.compile_piece(piece, list(args))
            delattr(self.split, target)
            returns_tuple = isinstance(piece.module.graph.output_node().args[0], (tuple, list))
            mod: nn.Module = CompiledPiece(fn, target, returns_tuple)
            if self.backend.opts.piecewise_cudagraphs:
                mod = PiecewiseGraphPiece(mod)
            self.split.add_submodule(target, mod)
        return out


def model_factors(model: nn.Module, dtype: torch.dtype) -> dict:
    """What of the model changes compiled code: its config, dtype, class and sources."""
    from compiled_llm.compile.cache import source_hash

    pkg = Path(__file__).resolve().parents[1]
    models_dir = Path(__import__("compiled_llm.models").models.__file__).parent
    passes_dir = Path(__import__("compiled_llm.passes").passes.__file__).parent
    return {
        "config": vars(model.config),
        "dtype": str(dtype),
        "class": type(model).__qualname__,
        "sources": source_hash(models_dir, passes_dir, pkg / "attention", pkg / "compile"),
    }


def _fake_value(node: fx.Node):
    return node.meta["example_value"] if "example_value" in node.meta else node.meta["val"]
