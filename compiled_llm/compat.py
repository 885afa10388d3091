"""Version shims for torch 2.11 .. 2.13, kept in this one module."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch


def allow_many_models(limit: int = 256) -> None:
    """Dynamo keeps one cache entry per model instance on the shared forward code object;
    a process holding many engines (tests, benchmarks) must not hit the default limit of 8."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit",
                 "accumulated_cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), limit))


def token_hint() -> int:
    """The size Inductor's heuristics assume for T: its own guess for an unhinted unbacked size,
    so that giving T this hint changes no heuristic that already used a guess."""
    return int(torch._inductor.config.unbacked_symint_fallback)


def mark_tokens_dynamic(*tensors: torch.Tensor) -> None:
    """Mark dim 0 (T) dynamic without specialising on 0/1, so no batch size recompiles.

    T carries an explicit size hint: Inductor scores a fusion by the bytes two kernels share and
    counts a buffer sized by an unhinted unbacked symbol as 0 bytes, so without a hint no
    reduction fuses with its [T, D] producers or consumers (an RMSNorm became 2-3 kernels)."""
    _count_hinted_unbacked_deps()
    for tensor in tensors:
        torch._dynamo.decorators.mark_unbacked(tensor, 0, hint_override=token_hint())


def _count_hinted_unbacked_deps() -> None:
    """torch < 2.13: Inductor's fusion scorer sizes every dependency with an unbacked symbol as
    0 bytes even when all its unbacked symbols carry a hint_override; 2.13 sizes those by their
    hints. Give older versions the same rule (once; a no-op where torch has it)."""
    from torch._inductor.graph import GraphLowering

    current = GraphLowering.get_dep_size_hint
    if getattr(current, "_hinted_unbacked", False):
        return
    if "all_unbacked_explicitly_hinted" in current.__code__.co_names:
        return  # this torch already sizes hinted unbacked deps
    GraphLowering.get_dep_size_hint = _dep_size_hint


def _dep_size_hint(self, dep, count_bytes: bool = True) -> int:
    """GraphLowering.get_dep_size_hint that also sizes deps whose unbacked symbols are hinted."""
    key = (dep, count_bytes)
    if key not in self.dep_size_hint_cache:
        self.dep_size_hint_cache[key] = _dep_size(self, dep, count_bytes)
    return self.dep_size_hint_cache[key]


_dep_size_hint._hinted_unbacked = True


def _dep_size(graph, dep, count_bytes: bool) -> int:
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    try:
        if dep.has_unbacked_symbols():
            hinted = graph.sizevars.shape_env.var_to_hint_override
            if not free_unbacked_symbols(dep.get_numel()).issubset(hinted.keys()):
                return 0  # an unhinted size must not count as a wrong number
        return dep.numbytes_hint() if count_bytes else dep.numel_hint()
    except KeyError:  # a dep on a buffer outside this graph (as Inductor itself tolerates)
        return 0


@contextmanager
def capture_inductor_code() -> Iterator[list[str]]:
    """Collect the Python output code Inductor generates inside the block."""
    from torch._inductor.graph import GraphLowering

    codes: list[str] = []
    original = GraphLowering.save_output_code
    GraphLowering.save_output_code = staticmethod(codes.append)
    try:
        yield codes
    finally:
        GraphLowering.save_output_code = original


def graph_break_count() -> int:
    """Graph breaks Dynamo has counted in this process."""
    return sum(torch._dynamo.utils.counters["graph_break"].values())


def pin_triton_cache_dir(device_index: int) -> str | None:
    """Set $TRITON_CACHE_DIR (unless set) to the directory Inductor would set it to when it
    loads its first kernel ({Inductor cache}/triton/{device}), and return it. Set at a worker's
    start, so every Triton kernel (ours too) of every process lands in, and is found in, one
    place, whatever ran first. None (nothing set) where Inductor's directory cannot be made."""
    from torch._inductor.runtime.cache_dir_utils import triton_cache_dir

    if "TRITON_CACHE_DIR" not in os.environ:
        try:
            os.environ["TRITON_CACHE_DIR"] = triton_cache_dir(device_index)
        except OSError:  # a read-only temp directory: Triton keeps its own default
            return None
    return os.environ["TRITON_CACHE_DIR"]


def inductor_pool_state() -> str:
    """Whether Inductor's compile workers are up ("ready"), starting, or not in use: a cold
    compile's log says which way its Triton kernels were built."""
    try:
        from torch._inductor.async_compile import AsyncCompile, get_compile_threads
    except ImportError:
        return "not in use"
    if get_compile_threads() <= 1:
        return "not in use"
    future = getattr(AsyncCompile, "_ready_future", None)
    if future is None:
        return "not started"
    return "ready" if future.done() else "starting"


def stop_compile_workers_nowait() -> None:
    """Ask each of Inductor's compile-worker pools to stop, without waiting: a process that
    exits next need not join 16 workers (1.0 s on the CPU), since each pool's sidecar stops
    its own workers on the message. Inductor's exit hook then finds the pools stopped. A pool
    of another kind, or of a torch whose pool this does not know, is left to the exit hook."""
    async_compile = sys.modules.get("torch._inductor.async_compile")
    if async_compile is None:  # Inductor never compiled here: no pool
        return
    from torch._inductor.compile_worker import subproc_pool

    for pool in list(getattr(async_compile, "_pool_set", ())):
        if isinstance(pool, subproc_pool.SubprocPool) and getattr(pool, "running", False):
            # never in the way of the exit: whatever this torch's pool lacks, the hook stops it
            with contextlib.suppress(Exception):
                _stop_sidecar(pool, subproc_pool)


def _stop_sidecar(pool, subproc_pool) -> None:
    """What SubprocPool.shutdown does, less its wait for the sidecar to exit."""
    send, header = subproc_pool._send_msg, subproc_pool.MsgHeader.SHUTDOWN
    with pool.write_lock:
        if getattr(pool, "timer", None) is not None:
            pool.timer.quit()  # its idle timer would otherwise quiesce a closed pool
        pool.running = False  # its shutdown() (the exit hook's) now returns at once
        if hasattr(pool, "running_waitcounter"):
            pool.running_waitcounter.__exit__()
        send(pool.write_pipe, header)
        pool.write_pipe.close()


def forget_inherited_compile_pools() -> None:
    """In a forked child: drop the Inductor thread pool inherited from the parent. Its worker
    threads did not survive the fork, yet the pool believes them idle, so a C++ kernel
    submitted to it waits forever (a tensor- or pipeline-parallel rank forked after its
    engine's process had compiled hung on its first compile). Torch's own fork hook resets
    only the subprocess pool; the thread pool is made anew on its next use."""
    async_compile = sys.modules.get("torch._inductor.async_compile")
    pool = getattr(getattr(async_compile, "AsyncCompile", None), "pool", None)
    if hasattr(pool, "cache_clear"):  # an lru_cache'd factory in torch 2.11 and 2.13
        pool.cache_clear()
