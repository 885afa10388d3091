"""Our own Triton kernels (attention, KV write, small-M GEMMs) compiled side by side on a cold
start: a dry pass over every shape the start-up runs hands each kernel's compile to child
processes (which also build its launcher) instead of compiling it at its first launch, one
after another (32 kernels for the 8B shape). $COMPILED_LLM_PARALLEL_TRITON_COMPILE=0: off."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import time

import torch

from compiled_llm.attention.forward_context import set_forward_context
from compiled_llm.compile import side_compile
from compiled_llm.worker.compile_children import (
    PARALLEL_ENV,
    PIECE_CHILDREN,
    CompileChildren,
    parallel_compiles_on,
    piece_children_count,
    stop_early,
    usable_cpus,
)
from compiled_llm.worker.graph_capture import dummy_schedule, padded_decode

ENV = PARALLEL_ENV
CHILDREN = 8  # compile processes (each imports torch and Triton and makes a CUDA context)
logger = logging.getLogger(__name__)
_dry: contextvars.ContextVar[KernelQueue | None] = contextvars.ContextVar("dry", default=None)


class KernelQueue:
    """The compiles a dry pass asked for, each once, handed to the compile children."""

    def __init__(self, children: CompileChildren) -> None:
        self.children = children
        self.kernels: set[tuple[int, str]] = set()
        self.first_at: float | None = None  # when the first kernel was queued
        self.errors: list[str] = []

    def take(self, hook_args: dict) -> bool:
        """Queue the compile that Triton's hook arguments describe, once; False for
        arguments of another shape (that kernel then compiles at its launch)."""
        try:
            jit_function = hook_args["fn"].jit_function
            ident = (id(jit_function), str(hook_args["key"]))
            spec = hook_args["compile"]["specialization_data"]
        except (KeyError, AttributeError, TypeError):
            return False
        if ident not in self.kernels:
            self.kernels.add(ident)
            self.first_at = self.first_at or time.perf_counter()
            self.children.submit(jit_function.fn.__module__, jit_function.fn.__qualname__, spec)
        return True


def _chained_hook(previous):
    """Triton's jit_cache_hook for a dry pass: queue the compile and skip the launch (True);
    outside the pass's context, whatever hook was installed before decides."""

    def hook(**kwargs) -> bool | None:
        queue = _dry.get()
        if queue is not None and queue.take(kwargs):
            return True
        return previous(**kwargs) if previous is not None else None

    return hook


def supported() -> bool:
    """Whether this Triton has the hook and the preload the dry pass needs."""
    try:
        import triton
        from triton.runtime.jit import JITFunction
    except ImportError:
        return False
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    return hasattr(runtime, "jit_cache_hook") and hasattr(JITFunction, "preload")


def wanted(runner) -> bool:
    """A lone CUDA worker whose pieces our backend compiles now (no snapshot came from the
    cache: a cold start, its kernels not in Triton's cache either), the switch on, and a
    Triton with the hook and preload."""
    return (runner.device.type == "cuda" and runner.step_hook is None and _cold(runner)
            and parallel_compiles_on() and supported())


def precompile_if_cold(runner, world_size: int, profile_tokens: int, max_len: int,
                       early: list = ()) -> bool:
    """precompile_kernels where wanted (and one process holds the model; it takes early's
    children); whether it ran. A failure is logged, never raised: the kernels then compile at
    their launches."""
    if world_size != 1 or not wanted(runner):
        return False
    try:
        precompile_kernels(runner, profile_tokens, max_len, early)
    except Exception as exc:  # noqa: BLE001 (the start-up goes on without it)
        logger.warning("side-by-side Triton compiles skipped: %s: %s", type(exc).__name__, exc)
    return True


@contextlib.contextmanager
def side_pieces(runner, world_size: int, early: list = ()):
    """Within, off CUDA (where precompile_kernels does it) on a cold start with the switch
    on (side_compile.ENV=1): warm compile children (early's, else new) take the backend's
    pieces. Every child is stopped on the way out; early's, where unused (a warm start, or
    CUDA's, which precompile_kernels took or never needed), before the forward."""
    if world_size != 1 or runner.device.type == "cuda" or not _cold(runner) or \
            not side_compile.wanted(runner.device.type):
        stop_early(early)
        yield
        return
    count = len(early) or piece_children_count()
    children = CompileChildren(count, None, warm=count, early=early)
    try:
        with side_compile.using(children):
            yield
    finally:
        children.kill()


def _cold(runner) -> bool:
    """Whether the runner's backend compiles now (no snapshot came from the cache)."""
    from compiled_llm.compile.backend import CompiledLLMBackend

    backend = getattr(runner.forward_fn, "backend", None)
    return isinstance(backend, CompiledLLMBackend) and not backend.graphs


@contextlib.contextmanager
def dry_launches(children: CompileChildren):
    """Within: a Triton kernel not compiled yet is queued for the children, not launched (its
    outputs are left as allocated); on a normal exit every queued compile has finished, on
    an error the children are stopped."""
    import triton

    runtime = triton.knobs.runtime
    previous = runtime.jit_cache_hook
    queue = KernelQueue(children)
    token = _dry.set(queue)
    runtime.jit_cache_hook = _chained_hook(previous)
    try:
        yield queue
    except BaseException:
        children.kill()
        raise
    finally:
        _dry.reset(token)
        runtime.jit_cache_hook = previous
    queue.errors = children.wait()


@torch.inference_mode()
def precompile_kernels(runner, profile_tokens: int, max_len: int, early: list = ()) -> None:
    """Compile, side by side, the kernels of every forward the start-up runs: the profiling
    step, the warm-up and each graph size of the plan. Runs on a one-block KV cache (every
    dummy row writes the null block); the allocator's blocks go back after."""
    start, wall_start = time.perf_counter(), time.time()
    piecewise, full = runner.cudagraph_plan()
    count = min(CHILDREN, usable_cpus())
    warm = min(PIECE_CHILDREN, count) if side_compile.wanted("cuda") else 0
    children = CompileChildren(count, torch.cuda.current_device(), warm=warm, early=early)
    runner.allocate_kv_cache(1)
    try:
        side = side_compile.using(children) if warm else contextlib.nullcontext()
        with dry_launches(children) as queue, side:
            spans = _dry_steps(runner, [(profile_tokens, max_len), (1, 1)])
            # the decode kernels are the longest compiles: queued before the piecewise sizes
            spans += _dry_decodes(runner, full)
            spans += _dry_steps(runner, [(s, s) for s in piecewise])
            swept = time.perf_counter()
    finally:
        runner.kv_caches = []
        torch.cuda.empty_cache()
    first = "-" if queue.first_at is None else f"{queue.first_at - start:.2f}"
    logger.info("Triton kernels compiled side by side: %d (%d failed) in %.2f s (first queued "
                "at %s s, dry forwards done at %.2f s)", len(queue.kernels), len(queue.errors),
                time.perf_counter() - start, first, swept - start)
    logger.info("Triton kernels compiled side by side, timeline: %s",
                _timeline(children.answers(), wall_start))
    logger.info("Triton kernels compiled side by side, dry forwards: %s", _spans(spans))
    for error in queue.errors[:3]:
        logger.warning("a side-by-side Triton compile failed (compiled at launch): %s", error)


def _timeline(answers: list[dict], wall_start: float) -> str:
    """When the children were ready and busy, in seconds from the pass's start."""
    times = [answer for answer in answers if "ended" in answer]
    if not times:
        return "no answers"
    busy = [answer["ended"] - answer["began"] for answer in times]
    return (f"children ready by {max(a['ready'] for a in times) - wall_start:.2f} s, first "
            f"compile began at {min(a['began'] for a in times) - wall_start:.2f} s, last ended "
            f"at {max(a['ended'] for a in times) - wall_start:.2f} s, {sum(busy):.2f} s of "
            f"compiles (longest {max(busy):.2f} s)")


def _spans(spans: list[tuple[str, float]]) -> str:
    """The first dry forward (Dynamo, passes, Inductor) apart, then the rest in sum."""
    if not spans:
        return "none"
    (first, first_s), rest = spans[0], spans[1:]
    slowest = max(rest, key=lambda span: span[1], default=("-", 0.0))
    return (f"{first} {first_s:.2f} s (the compile), then {len(rest)} more in "
            f"{sum(s for _, s in rest):.2f} s (slowest {slowest[0]} {slowest[1]:.3f} s)")


def _dry_steps(runner, shapes: list[tuple[int, int]]) -> list[tuple[str, float]]:
    spans = []
    for tokens, max_len in shapes:
        began = time.perf_counter()
        sched = dummy_schedule(tokens, runner.cache_cfg.block_size, max_len)
        try:  # the logits of each request's last row, as a step samples them
            hidden = runner.run_forward(runner.input_batch.prepare(sched))
            runner.model.compute_logits(hidden[-len(sched.scheduled):])
        finally:
            runner.release({req.request_id for req, _ in sched.scheduled})
        spans.append((f"step {tokens}/{max_len}", time.perf_counter() - began))
    return spans


def _dry_decodes(runner, sizes: list[int]) -> list[tuple[str, float]]:
    batch, spans = runner.input_batch, []
    for size in reversed([s for s in sizes if s <= min(batch.max_seqs, batch.max_tokens)]):
        began = time.perf_counter()
        ids, positions, ctx = padded_decode(runner, size)
        with set_forward_context(ctx):
            runner.model.compute_logits(runner.forward_fn(ids, positions)[:size])
        spans.append((f"decode {size}", time.perf_counter() - began))
    return spans
