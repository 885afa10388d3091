"""Our own Triton kernels (attention, KV write, small-M GEMMs) compiled side by side on a cold
start: a dry pass over every shape the start-up runs hands each kernel's compile to child
processes instead of compiling it at its first launch, one after another (26 kernels for the
8B shape, 11 s of its cold compile). $COMPILED_LLM_PARALLEL_TRITON_COMPILE=0 turns it off."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import time

import torch

from compiled_llm.attention.forward_context import ForwardContext, set_forward_context
from compiled_llm.worker.compile_children import CompileChildren
from compiled_llm.worker.graph_capture import dummy_schedule

ENV = "COMPILED_LLM_PARALLEL_TRITON_COMPILE"
CHILDREN = 8  # compile processes (each imports torch and makes a CUDA context)
logger = logging.getLogger(__name__)
_dry: contextvars.ContextVar[KernelQueue | None] = contextvars.ContextVar("dry", default=None)


class KernelQueue:
    """The compiles a dry pass asked for, each once, handed to the compile children."""

    def __init__(self, children: CompileChildren) -> None:
        self.children = children
        self.kernels: set[tuple[int, str]] = set()
        self.first_at: float | None = None  # when the first kernel was queued
        self.errors: list[str] = []

    def submit(self, jit_function, key, specialization: str) -> None:
        """Queue jit_function's compile for this specialization, once."""
        ident = (id(jit_function), str(key))
        if ident not in self.kernels:
            self.kernels.add(ident)
            self.first_at = self.first_at or time.perf_counter()
            self.children.submit(jit_function.fn.__module__, jit_function.fn.__qualname__,
                                 specialization)


def _hook(**kwargs) -> bool | None:
    """Triton's jit_cache_hook: in a dry pass, queue the compile and skip the launch (True);
    elsewhere let Triton compile as usual (None)."""
    queue = _dry.get()
    if queue is None:
        return None
    try:
        queue.submit(kwargs["fn"].jit_function, kwargs["key"],
                     kwargs["compile"]["specialization_data"])
    except (KeyError, AttributeError):  # another Triton's hook arguments: compile in place
        return None
    return True


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
    """A lone CUDA worker whose compiled pieces did not come from the cache (a cold start:
    its kernels are not in Triton's cache either) and whose Triton supports the dry pass."""
    backend = getattr(runner.forward_fn, "backend", None)
    warm = bool(getattr(backend, "graphs", None))
    off = os.environ.get(ENV, "1").strip().lower() in ("0", "false", "off", "no")
    return (runner.device.type == "cuda" and runner.step_hook is None and not warm and not off
            and supported())


@contextlib.contextmanager
def dry_launches(children: CompileChildren):
    """Within: a Triton kernel not compiled yet is queued for the children, not launched (its
    outputs are left as allocated); on exit, every queued compile has finished."""
    import triton

    runtime = triton.knobs.runtime
    previous = runtime.jit_cache_hook
    queue = KernelQueue(children)
    token = _dry.set(queue)
    runtime.jit_cache_hook = _hook
    try:
        yield queue
    finally:
        _dry.reset(token)
        runtime.jit_cache_hook = previous
        queue.errors = children.wait()


@torch.inference_mode()
def precompile_kernels(runner, profile_tokens: int, max_len: int) -> None:
    """Compile, side by side, the kernels of every forward the start-up runs: the profiling
    step, the warm-up and each graph size of the plan. Runs on a one-block KV cache (every
    dummy row writes the null block); the allocator's blocks go back after."""
    start = time.perf_counter()
    piecewise, full = runner.cudagraph_plan()
    children = CompileChildren(min(CHILDREN, os.cpu_count() or 1), torch.cuda.current_device())
    runner.allocate_kv_cache(1)
    try:
        with dry_launches(children) as queue:
            _dry_steps(runner, [(profile_tokens, max_len), (1, 1)] + [(s, s) for s in piecewise])
            _dry_decodes(runner, full)
            swept = time.perf_counter()
    finally:
        runner.kv_caches = []
        torch.cuda.empty_cache()
    first = "-" if queue.first_at is None else f"{queue.first_at - start:.2f}"
    logger.info("Triton kernels compiled side by side: %d (%d failed) in %.2f s (first queued "
                "at %s s, dry forwards done at %.2f s)", len(queue.kernels), len(queue.errors),
                time.perf_counter() - start, first, swept - start)
    for error in queue.errors[:3]:
        logger.warning("a side-by-side Triton compile failed (compiled at launch): %s", error)


def _dry_steps(runner, shapes: list[tuple[int, int]]) -> None:
    for tokens, max_len in shapes:
        sched = dummy_schedule(tokens, runner.cache_cfg.block_size, max_len)
        try:  # the logits of each request's last row, as a step samples them
            hidden = runner.run_forward(runner.input_batch.prepare(sched))
            runner.model.compute_logits(hidden[-len(sched.scheduled):])
        finally:
            runner.release({req.request_id for req, _ in sched.scheduled})


def _dry_decodes(runner, sizes: list[int]) -> None:
    batch = runner.input_batch
    for size in reversed([s for s in sizes if s <= min(batch.max_seqs, batch.max_tokens)]):
        batch.pad(size)
        ids, positions, meta = batch.padded_inputs(size, runner.max_model_len)
        ctx = ForwardContext(meta, runner.kv_caches, runner.attn_backend,
                             kv_scales=runner.kv_scales)
        with set_forward_context(ctx):
            runner.model.compute_logits(runner.forward_fn(ids, positions)[:size])
