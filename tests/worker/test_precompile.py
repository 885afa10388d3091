"""The cold start's side-by-side Triton compiles: the dry pass's hook queues each kernel once
and skips its launch, lets Triton compile elsewhere, and is off on CPU and by its switch."""

import threading
from types import SimpleNamespace

import pytest
import torch

from compiled_llm.worker import precompile


class Kernel:
    """A stand-in for a JITFunction: what the hook reads and what the pool calls."""

    def __init__(self) -> None:
        self.preloaded: list[tuple[str, str]] = []

    def preload(self, specialization: str) -> None:
        self.preloaded.append((specialization, threading.current_thread().name))


def _hook_args(kernel: Kernel, key: str) -> dict:
    info = type("Info", (), {"jit_function": kernel})()
    return {"key": key, "fn": info, "compile": {"specialization_data": f"spec-{key}"}}


def test_hook_compiles_in_place_outside_a_dry_pass():
    assert precompile._hook(**_hook_args(Kernel(), "a")) is None


@pytest.mark.skipif(not precompile.supported(), reason="this Triton lacks the hook")
def test_dry_pass_queues_each_specialization_once_on_the_pool():
    kernel = Kernel()
    with precompile.dry_launches(2) as queue:
        assert precompile._hook(**_hook_args(kernel, "a")) is True  # launch skipped
        assert precompile._hook(**_hook_args(kernel, "a")) is True
        assert precompile._hook(**_hook_args(kernel, "b")) is True
        assert precompile._hook(fn=None) is None  # unknown arguments: compile in place
    assert sorted(spec for spec, _ in kernel.preloaded) == ["spec-a", "spec-b"]
    assert all(name.startswith("triton-compile") for _, name in kernel.preloaded)
    assert queue.failed == 0
    assert precompile._hook(**_hook_args(kernel, "c")) is None  # the pass is over


@pytest.mark.skipif(not precompile.supported(), reason="this Triton lacks the hook")
def test_failed_compiles_are_counted_not_raised():
    class Broken(Kernel):
        def preload(self, specialization: str) -> None:
            raise RuntimeError("no")

    with precompile.dry_launches(1) as queue:
        precompile._hook(**_hook_args(Broken(), "a"))
    assert queue.failed == 1


def _runner(device: str, warm: bool, step_hook=None):
    backend = SimpleNamespace(graphs=["snapshot"] if warm else [])
    return SimpleNamespace(device=torch.device(device), step_hook=step_hook,
                           forward_fn=SimpleNamespace(backend=backend))


@pytest.mark.skipif(not precompile.supported(), reason="this Triton lacks the hook")
def test_wanted_only_on_a_cold_lone_cuda_worker(monkeypatch):
    monkeypatch.delenv(precompile.ENV, raising=False)
    assert precompile.wanted(_runner("cuda", warm=False))
    assert not precompile.wanted(_runner("cpu", warm=False))
    assert not precompile.wanted(_runner("cuda", warm=True))  # the snapshot came from cache
    assert not precompile.wanted(_runner("cuda", warm=False, step_hook=object()))
    monkeypatch.setenv(precompile.ENV, "off")
    assert not precompile.wanted(_runner("cuda", warm=False))
