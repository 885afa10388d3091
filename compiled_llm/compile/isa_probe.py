"""Inductor's CPU vector-ISA probe, run ahead in a thread. Before its first CPU kernel (compiled
or loaded from a warm cache) Inductor loads a test library per ISA the CPU lists, each in a
fresh interpreter: ~1.5 s of every CPU process. Started as a CPU worker starts, it overlaps the
weights' load; compile_model waits for it, and Inductor then finds its answer cached."""

from __future__ import annotations

import contextlib
import threading

_thread: threading.Thread | None = None


def start_cpu_isa_probe() -> None:
    """Probe the CPU's vector ISAs in a background thread (once per process)."""
    global _thread
    if _thread is not None:
        return
    try:
        # imported here, in the calling thread: two threads importing the same modules at once
        # can meet half-initialised ones
        from torch._inductor import codecache, cpp_builder, cpu_vec_isa  # noqa: F401
        from torch.utils import _filelock  # noqa: F401 (the probe's lock)
    except ImportError:
        return
    probe = getattr(cpu_vec_isa, "valid_vec_isa_list", None)
    if probe is None:  # another torch: Inductor probes when it needs to, as before
        return
    _thread = threading.Thread(target=_run, args=(probe,), name="cpu-isa-probe", daemon=True)
    _thread.start()


def _run(probe) -> None:
    # a failure is not cached (functools.cache keeps results only): Inductor probes again
    with contextlib.suppress(Exception):
        probe()


def wait_cpu_isa_probe() -> None:
    """Block until a probe started ahead has finished (nothing to wait for otherwise)."""
    if _thread is not None:
        _thread.join()
