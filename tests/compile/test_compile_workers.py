"""Inductor's compile workers at a CLI process's exit: told to stop and not waited for, they
still all exit (no orphans), and Inductor's own exit hook then has nothing left to wait for."""

from __future__ import annotations

import os
import time

import torch

from compiled_llm.compat import stop_compile_workers_nowait


def _children(pid: int) -> list[int]:
    tasks = f"/proc/{pid}/task"
    found: list[int] = []
    for task in os.listdir(tasks):
        with open(f"{tasks}/{task}/children") as listing:
            found += [int(child) for child in listing.read().split()]
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def _no_wait(timeout=None):
    raise AssertionError("waited for the sidecar")


def test_workers_stop_without_a_wait(monkeypatch):
    from torch._inductor import async_compile

    async_compile.shutdown_compile_workers()  # a pool of this process's own, fresh
    monkeypatch.setattr(torch._inductor.config, "compile_threads", 2)
    monkeypatch.setattr(torch._inductor.config, "worker_start_method", "subprocess")
    async_compile.AsyncCompile.wait_pool_ready(timeout=300)
    pool = next(iter(async_compile._pool_set))
    try:
        workers, sidecar = _children(pool.process.pid), pool.process
        assert workers, "the sidecar started no workers"
        with monkeypatch.context() as patch:
            patch.setattr(sidecar, "wait", _no_wait)
            stop_compile_workers_nowait()
            async_compile.shutdown_compile_workers()  # Inductor's exit hook: returns at once
        assert not pool.running
        assert sidecar.wait(timeout=120) is not None  # the sidecar exits by itself
        deadline = time.monotonic() + 60
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in workers)
    finally:
        async_compile.shutdown_compile_workers()
