"""The collector in the processes serving owns (engine core, API servers, workers): what
start-up built (torch, the compiled model, the server stack: about half a million objects) is
frozen once the process is ready, so the full collections serving's allocations trigger walk
only what serving made, not a 0.1-0.2 s heap while every stream waits. Never frozen in a user's
process (an in-process `LLM`): freezing is process-wide. $COMPILED_LLM_GC_DEBUG logs pauses."""

from __future__ import annotations

import gc
import logging
import os
import time

ENV_GC_FREEZE = "COMPILED_LLM_GC_FREEZE"
ENV_GC_DEBUG = "COMPILED_LLM_GC_DEBUG"
DEBUG_MIN_MS = 1.0  # shorter collections are not logged

logger = logging.getLogger(__name__)
_started: dict[int, float] = {}


def freeze_startup_heap() -> bool:
    """Move every live object to the collector's permanent generation (unless
    $COMPILED_LLM_GC_FREEZE is 0); whether it froze. No collection first: it took 0.22-0.30 s
    in each API server on the H200 host, start-up time for a few thousand objects of garbage.
    Reference counting still frees frozen objects; only their cycles wait for the process's
    end. Installs the debug log."""
    install_gc_debug()
    if os.environ.get(ENV_GC_FREEZE, "1") == "0":
        return False
    gc.freeze()
    return True


def thaw_heap() -> None:
    """Undo freeze_startup_heap as the process winds down: left frozen, start-up's cycles
    outlive the interpreter's teardown, and Triton's nanobind module prints a page of "leaked
    instances" at exit (a clean shutdown that reads like a crash)."""
    gc.unfreeze()


def install_gc_debug() -> bool:
    """With $COMPILED_LLM_GC_DEBUG=1, log every collection of DEBUG_MIN_MS or more (generation,
    milliseconds, objects collected, time.monotonic() at its start) at WARNING; once per
    process. Whether the log is on."""
    if os.environ.get(ENV_GC_DEBUG, "0") in ("", "0"):
        return False
    if _log_pause not in gc.callbacks:
        gc.callbacks.append(_log_pause)
    return True


def _log_pause(phase: str, info: dict) -> None:
    generation = info["generation"]
    if phase == "start":
        _started[generation] = time.monotonic()
        return
    began = _started.pop(generation, None)
    if began is None:
        return
    millis = (time.monotonic() - began) * 1e3
    if millis >= DEBUG_MIN_MS:
        logger.warning("gc: generation %d took %.1f ms, collected %d (pid %d, monotonic %.3f)",
                       generation, millis, info["collected"], os.getpid(), began)
