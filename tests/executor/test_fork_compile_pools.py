"""A rank forked after its engine's process compiled must compile on its own: Inductor's
thread pool, inherited from the parent without its threads, is dropped in the child
(compat.forget_inherited_compile_pools, called first thing by executor.mp_worker.run_worker).
Without that, a TP/PP rank forked after a compiled engine in the same process hung on its
first C++ kernel until gloo's 600 s timeout."""

from __future__ import annotations

import multiprocessing
import os
import pickle
from types import SimpleNamespace

import pytest
import torch

from compiled_llm.executor import mp_worker

pytestmark = pytest.mark.slow  # forks a process
ARGS = SimpleNamespace(world_size=2, pipeline_parallel_size=1, seed=0)


class _PoolWorks(Exception):
    """Raised by the stand-in group join once the child's compile pool ran a job."""


def _compile_instead_of_joining(*args, **kwargs):
    from torch._inductor.async_compile import AsyncCompile

    # what Inductor does for a C++ kernel: submit it to the pool and wait for it
    assert AsyncCompile.pool().submit(int, "7").result() == 7
    raise _PoolWorks


def test_forked_rank_compiles_after_the_parent_used_the_pool(monkeypatch):
    from torch._inductor.async_compile import AsyncCompile

    pool = AsyncCompile.pool()  # the parent's threads, started
    assert [f.result() for f in [pool.submit(int, "1"), pool.submit(int, "2")]] == [1, 2]
    monkeypatch.setattr(mp_worker, "init_tp_group", _compile_instead_of_joining)
    read_fd, write_fd = os.pipe()
    spec = mp_worker.WorkerSpec("unused", torch.float32, torch.device("cpu"), None)
    process = multiprocessing.get_context("fork").Process(
        target=mp_worker.run_worker, args=(ARGS, spec, 1, "tcp://unused", write_fd))
    process.start()
    os.close(write_fd)
    process.join(30)
    if process.is_alive():  # the inherited pool's threads never ran the job
        process.kill()
        process.join()
    with os.fdopen(read_fd, "rb") as status:
        report = status.read()
    assert report, "the forked rank hung on its first compile"
    kind, message = pickle.loads(report)
    assert kind == "error" and "_PoolWorks" in message
