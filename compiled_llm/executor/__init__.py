"""Executors: how the engine reaches its workers. One interface (UniProcExecutor's methods);
the uniprocess executor runs the one worker in the engine's process, the multiprocess one a
tensor-parallel group with a process (or, with Ray, an actor) per rank. `make_executor` picks by
distributed_executor_backend."""

from __future__ import annotations

from compiled_llm.config import EngineArgs


def make_executor(args: EngineArgs, spec):
    """The executor args.executor_backend names ("uni", "mp" or "ray"), started for spec."""
    if args.executor_backend == "ray":
        from compiled_llm.executor.ray_executor import RayExecutor

        return RayExecutor(args, spec)
    if args.executor_backend == "mp":
        from compiled_llm.executor.mp_executor import MultiprocExecutor

        return MultiprocExecutor(args, spec)
    from compiled_llm.executor.uniproc_executor import UniProcExecutor

    return UniProcExecutor(args, spec)
