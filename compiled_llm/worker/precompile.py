"""Our own Triton kernels (attention, KV write, small-M GEMMs) compiled side by side on a cold
start: one dry pass over every shape the start-up will run queues each kernel's compile on a
thread pool instead of compiling it at its first launch, one after another (63 kernels, most of
a cold 8B compile's profiling and capture). $COMPILED_LLM_PARALLEL_TRITON_COMPILE=0 turns it off."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from compiled_llm.attention.forward_context import ForwardContext, set_forward_context
from compiled_llm.worker.graph_capture import dummy_schedule

ENV = "COMPILED_LLM_PARALLEL_TRITON_COMPILE"
logger = logging.getLogger(__name__)
_dry: contextvars.ContextVar[KernelQueue | None] = contextvars.ContextVar("dry", default=None)


class KernelQueue:
    """The compiles a dry pass asked for, each once, running on `pool`."""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self.pool = pool
        self.futures: dict[tuple[int, str], Future] = {}
        self.failed = 0

    def submit(self, jit_function, key, specialization: str) -> None:
        """Queue jit_function's compile for this specialization (Triton's preload: it lands
        in the function's kernel cache, so the real launch finds it)."""
        ident = (id(jit_function), str(key))
        if ident not in self.futures:
            device = torch.cuda.current_device() if torch.cuda.is_available() else None
            self.futures[ident] = self.pool.submit(_compile, jit_function, specialization,
                                                   device)

    def wait(self) -> int:
        """Wait for every compile; how many failed (their launches compile them again, and
        say why)."""
        failed = 0
        for future in self.futures.values():
            try:
                future.result()
            except Exception as exc:  # noqa: BLE001 (the real launch raises it properly)
                failed += 1
                logger.debug("parallel Triton compile failed: %s", exc)
        return failed


def _compile(jit_function, specialization: str, device: int | None) -> None:
    if device is not None:  # the pool's threads start on device 0
        torch.cuda.set_device(device)
    jit_function.preload(specialization)


def _hook(**kwargs) -> bool | None:
    """Triton's jit_cache_hook: in a dry pass, queue the compile and skip the launch (True);
    elsewhere (the pool's threads included) let Triton compile as usual (None)."""
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
def dry_launches(workers: int):
    """Within: a Triton kernel not compiled yet is queued for compiling, not launched (its
    outputs are left as allocated); on exit, every queued compile has finished."""
    import triton

    runtime = triton.knobs.runtime
    previous = runtime.jit_cache_hook
    with ThreadPoolExecutor(workers, thread_name_prefix="triton-compile") as pool:
        queue = KernelQueue(pool)
        token = _dry.set(queue)
        runtime.jit_cache_hook = _hook
        try:
            yield queue
        finally:
            _dry.reset(token)
            runtime.jit_cache_hook = previous
            queue.failed = queue.wait()


@torch.inference_mode()
def precompile_kernels(runner, profile_tokens: int, max_len: int) -> None:
    """Compile, side by side, the kernels of every forward the start-up runs: the profiling
    step, the warm-up and each graph size of the plan. Runs on a one-block KV cache (every
    dummy row writes the null block); the allocator's blocks go back after."""
    start = time.perf_counter()
    piecewise, full = runner.cudagraph_plan()
    runner.allocate_kv_cache(1)
    try:
        with dry_launches(min(16, os.cpu_count() or 1)) as queue:
            _dry_steps(runner, [(profile_tokens, max_len), (1, 1)] + [(s, s) for s in piecewise])
            _dry_decodes(runner, full)
    finally:
        runner.kv_caches = []
        torch.cuda.empty_cache()
    logger.info("Triton kernels compiled side by side: %d (%d failed) in %.2f s",
                len(queue.futures), queue.failed, time.perf_counter() - start)


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
