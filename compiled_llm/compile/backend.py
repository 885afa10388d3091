"""The compiled-llm torch.compile backend.

Dynamo graph -> split at attention -> for each unique piece: passes + Inductor (or the disk
cache) -> a split graph whose compute pieces are compiled and whose attention ops run eagerly.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import fx, nn

from compiled_llm.compat import inductor_pool_state
from compiled_llm.compile import side_compile, snapshot
from compiled_llm.compile.cache import CompileCache
from compiled_llm.compile.counters import counters
from compiled_llm.compile.dump import PieceDumper
from compiled_llm.compile.split import Piece, piece_hash, split_graph

logger = logging.getLogger(__name__)


@dataclass
class BackendOptions:
    """What one backend instance uses: cache, dumps, the post-grad pass, the piece wrapper."""

    cache: CompileCache | None = None
    dump_dir: str | None = None
    post_grad_pass: object = None  # a CustomGraphPass run by Inductor after its own passes
    inductor_options: dict | None = None
    # wraps each compiled piece (the worker's piecewise CUDA graphs); None leaves it bare
    piece_wrapper: Callable[[nn.Module], nn.Module] | None = None


class CompiledPiece(nn.Module):
    """A compiled piece in place of its GraphModule; same call signature and outputs."""

    def __init__(self, fn, key: str, returns_tuple: bool) -> None:
        super().__init__()
        self.fn, self.key, self.returns_tuple = fn, key, returns_tuple

    def forward(self, *args):
        """The compiled piece's outputs, shaped as the graph it replaced returned them."""
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
        self.call_locals: dict | None = None  # the compiled call's arguments, for the snapshot
        self.snapshot_name: str | None = None  # set to store a warm-start snapshot
        self.captures = 0
        self.dumper = PieceDumper(opts.dump_dir) if opts.dump_dir else None
        self.graphs: list[fx.GraphModule] = []  # every split graph returned or loaded
        # piece key -> (job id, job file, wall-clock time sent)
        self.side_jobs: dict[str, tuple[int, str, float]] = {}

    def __call__(self, gm: fx.GraphModule, example_inputs: list) -> fx.GraphModule:
        t0 = time.perf_counter()
        counters.graphs_captured += 1
        self.captures += 1
        counters.recompiles += int(self.captures > 1)
        if self.call_started is not None:
            counters.add_time("dynamo", t0 - self.call_started)
        self._pre_split(gm)
        split, pieces = split_graph(gm)
        counters.add_time("split", time.perf_counter() - t0)
        self._submit_side(pieces)
        # the placeholders' fake values carry the symbolic T; example_inputs are real tensors
        fakes = [_fake_value(n) for n in gm.graph.nodes if n.op == "placeholder"]
        mode = next(f.fake_mode for f in fakes if isinstance(f, torch.Tensor))
        compiler = _PieceCompiler(split, self, {p.name: p for p in pieces})
        with mode:
            compiler.run(*fakes)
        if self.captures == 1:
            self._save_snapshot(gm, split, compiler.refs, example_inputs)
            self.call_locals = None  # holds the first call's inputs
        self.graphs.append(split)
        return split

    def _pre_split(self, gm: fx.GraphModule) -> None:
        """The pass manager's pre-split passes on the whole graph (the fused KV write)."""
        pre_split = getattr(self.opts.post_grad_pass, "pre_split", None)
        if pre_split is None:
            return
        for name, matches, secs in pre_split(gm.graph):
            counters.add_matches(name, matches)
            counters.add_time(f"pass {name}", secs)
        gm.recompile()

    def wrap(self, fn, key: str, returns_tuple: bool) -> nn.Module:
        """A compiled piece as a module of the split graph (in the piece wrapper if one)."""
        mod: nn.Module = CompiledPiece(fn, key, returns_tuple)
        return self.opts.piece_wrapper(mod) if self.opts.piece_wrapper is not None else mod

    def _save_snapshot(self, gm, split, refs: dict, example_inputs: list) -> None:
        cache, name = self.opts.cache, self.snapshot_name
        if cache is None or name is None or self.dumper or self.call_locals is None:
            return
        sources = snapshot.input_sources(gm)
        out = gm.graph.output_node().args[0]
        if (sources is None or not isinstance(out, (tuple, list)) or len(out) != 1
                or not snapshot.sources_match(sources, example_inputs, self.call_locals)):
            logger.info("no warm-start snapshot: graph inputs or output not as expected")
            return
        try:
            data = snapshot.dumps(split, refs, sources)
        except Exception as e:  # an unpicklable graph only costs the Dynamo-free warm start
            logger.info("no warm-start snapshot: %s", e)
            return
        cache.save_blob(name, data)

    def load_snapshot(self, model: nn.Module):
        """forward(input_ids, positions) rebuilt from the cache without Dynamo, or None."""
        cache, name = self.opts.cache, self.snapshot_name
        if cache is None or name is None or self.dumper:
            return None
        t0 = time.perf_counter()
        data = cache.load_blob(name)
        if data is None:
            return None
        try:
            graph, sources = snapshot.loads(data)
        except Exception as e:
            cache.discard(name, e)
            return None
        for target, ref in list(graph.named_children()):
            if isinstance(ref, snapshot.PieceRef):
                counters.pieces += 1
                fn = self.compiled.get(ref.key) or self._load_cached(ref.key)
                if fn is None:
                    return None  # a piece is gone: compile through Dynamo instead
                setattr(graph, target, self.wrap(fn, target, ref.returns_tuple))
        counters.snapshot_loads += 1
        counters.add_time("snapshot_load", time.perf_counter() - t0)
        self.graphs.append(graph)
        return snapshot.warm_forward(graph, sources, model)

    def release(self) -> None:
        """Drop every compiled piece and the piecewise CUDA graphs they captured; the split
        graphs are left empty. Dynamo keeps this backend and the graphs it returned for the
        life of the process (cache entries on the model class's forward, compiled-function
        globals) and an fx GraphModule is in a reference cycle with its Graph, so dropping
        references alone would free none of it. Nothing can run through this backend after."""
        for graph in self.graphs:
            for name, _ in list(graph.named_children()):
                delattr(graph, name)
        self.graphs.clear()
        self.compiled.clear()
        self.call_locals = None
        for _, path, _ in self.side_jobs.values():  # sent to a child, never awaited
            Path(path).unlink(missing_ok=True)
        self.side_jobs.clear()

    def _load_cached(self, key: str):
        with self.opts.cache.lock():
            fn = self._timed_load(key)
        if fn is not None:
            counters.unique_pieces += 1
            self.compiled[key] = fn
        return fn

    def compile_piece(self, piece: Piece, args: list, key: str) -> object:
        """Compiled callable for a piece: reuse by hash, else the cache, else Inductor."""
        counters.pieces += 1
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
        side = self._side_answer(key, piece.name)  # outside the lock: the child takes it
        with cache.lock():
            fn = self._timed_load(key, count=side is None)
            if fn is None:
                fn = self._inductor(key, piece, args)
                cache.save(key, fn, {"piece": piece.name})
            elif side is not None:
                self._count_side(side)
        return fn

    def _submit_side(self, pieces: list[Piece]) -> None:
        """Hand each unique piece the cache lacks to the compile children, if any are up
        (side_compile); their answers are awaited where each piece is compiled."""
        side, cache = side_compile.current(), self.opts.cache
        if side is None or cache is None or self.dumper:
            return
        for piece in pieces:
            key = None if piece.is_split_op else piece_hash(piece.module)
            if key is None or key in self.compiled or key in self.side_jobs or cache.has(key):
                continue
            path = None
            try:
                path = side_compile.write_job(piece.module, key, cache.dir,
                                              self.opts.post_grad_pass,
                                              self.opts.inductor_options)
                self.side_jobs[key] = (side.submit_piece(path), path, time.time())
            except Exception as exc:  # noqa: BLE001 (that piece compiles here instead)
                if path is not None:
                    Path(path).unlink(missing_ok=True)
                logger.info("piece %s not sent to a compile child: %s: %s", piece.name,
                            type(exc).__name__, exc)

    def _side_answer(self, key: str, name: str) -> dict | None:
        """The child's answer for key's piece (None: no job, or it failed: compile here)."""
        job = self.side_jobs.pop(key, None)
        if job is None:
            return None
        side, t0 = side_compile.current(), time.perf_counter()
        try:
            answer = None if side is None else side.piece_answer(job[0], side_compile.TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 (the piece compiles here instead)
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        finally:
            Path(job[1]).unlink(missing_ok=True)
        waited = time.perf_counter() - t0
        if not answer or not answer.get("ok"):
            logger.warning("piece %s: its compile child failed (%s); compiling it here", name,
                           (answer or {}).get("error", "no answer"))
            return None
        # the child's set-up ended this long after the job was sent (negative: before)
        setup = answer.get("ready", job[2]) - job[2]
        logger.info("Inductor piece %s: %.2f s in a compile child (waited %.2f s here; the "
                    "child was set up %+.2f s from the send)", name, answer["seconds"], waited,
                    setup)
        return {**answer, "waited": waited}

    def _count_side(self, answer: dict) -> None:
        counters.cache_misses += 1  # as a compile here counts it
        counters.inductor_compiles += 1
        counters.add_time("inductor", answer["waited"])  # what it cost this process
        add_stats = getattr(self.opts.post_grad_pass, "add_stats", None)
        if add_stats is not None:
            add_stats(answer["passes"])
        for name, matches, secs in answer["passes"]:
            counters.add_matches(name, matches)
            counters.add_time(f"pass {name}", secs)

    def _timed_load(self, key: str, count: bool = True):
        t0 = time.perf_counter()
        fn = self.opts.cache.load(key, count=count)
        counters.add_time("cache_load", time.perf_counter() - t0)
        return fn

    def _inductor(self, key: str, piece: Piece, args: list):
        patches = dict(self.opts.inductor_options or {})
        if self.opts.post_grad_pass is not None:
            patches["post_grad_custom_post_pass"] = self.opts.post_grad_pass
        if self.dumper:  # Inductor's own cache would skip the passes, and so their dumps
            patches["fx_graph_cache"] = False
        t0, pool = time.perf_counter(), inductor_pool_state()
        dump = self.dumper.piece(key, piece, self.opts.post_grad_pass) if self.dumper \
            else contextlib.nullcontext()
        with dump, torch._inductor.config.patch(patches):
            fn = torch._inductor.standalone_compile(piece.module, args, dynamic_shapes="from_graph")
        seconds = time.perf_counter() - t0
        counters.inductor_compiles += 1
        counters.add_time("inductor", seconds)
        logger.info("Inductor piece %s: %.2f s (compile workers %s at its start)", piece.name,
                    seconds, pool)
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
        self.refs: dict[str, snapshot.PieceRef] = {}  # split target -> its compiled piece's key

    def call_module(self, target, args, kwargs):
        """Run the piece on fake inputs, then swap it for its compiled form."""
        out = super().call_module(target, args, kwargs)
        piece = self.pieces.get(target)
        if piece is not None and not piece.is_split_op:
            key = piece_hash(piece.module)
            fn = self.backend.compile_piece(piece, list(args), key)
            delattr(self.split, target)
            returns_tuple = isinstance(piece.module.graph.output_node().args[0], (tuple, list))
            self.split.add_submodule(target, self.backend.wrap(fn, target, returns_tuple))
            self.refs[target] = snapshot.PieceRef(key, returns_tuple)
        return out


def model_factors(model: nn.Module, dtype: torch.dtype) -> dict:
    """What of the model changes compiled code: its config, dtype, class and sources."""
    from compiled_llm.compile.cache import source_hash

    pkg = Path(__file__).resolve().parents[1]
    models_dir = Path(__import__("compiled_llm.models").models.__file__).parent
    passes_dir = Path(__import__("compiled_llm.passes").passes.__file__).parent
    extra = getattr(model, "extra_compile_factors", None)  # load-time transforms' (LoRA)
    return {
        **({"extra": extra} if extra else {}),
        "config": vars(model.config),
        "dtype": str(dtype),
        "class": type(model).__qualname__,
        # the classes of its modules: a block-FP8 checkpoint and quantization="fp8" (or two
        # formats) can store tensors of the same names and shapes but trace different graphs
        "modules": sorted({f"{type(m).__module__}.{type(m).__qualname__}"
                           for m in model.modules()}),
        # compat.py: how T is marked (its size hint steers Inductor's fusion)
        "sources": source_hash(models_dir, passes_dir, pkg / "attention", pkg / "moe",
                               pkg / "gemm", pkg / "quantization", pkg / "compile",
                               pkg / "compat.py"),
    }


def _fake_value(node: fx.Node):
    return node.meta["example_value"] if "example_value" in node.meta else node.meta["val"]
