"""The serving processes' collector: the start-up heap frozen (or not, when turned off), and
the pause log that $COMPILED_LLM_GC_DEBUG turns on."""

from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys

from compiled_llm.core import gc_heap

FREEZE_PROBE = ("import gc; from compiled_llm.core.gc_heap import freeze_startup_heap; "
                "import torch; froze = freeze_startup_heap(); "
                "print(froze, gc.get_freeze_count())")


def _probe(**env: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", FREEZE_PROBE], capture_output=True, text=True,
                         env={**os.environ, **env}, check=True, timeout=120).stdout.split()
    return out[0], int(out[1])


def test_freeze_moves_the_startup_heap_out_of_collections():
    froze, frozen = _probe(COMPILED_LLM_GC_FREEZE="1")
    assert froze == "True"
    assert frozen > 50_000  # torch alone brings far more objects than this


def test_freeze_can_be_turned_off():
    assert _probe(COMPILED_LLM_GC_FREEZE="0") == ("False", 0)


def test_debug_logs_collections(monkeypatch, caplog):
    monkeypatch.setenv(gc_heap.ENV_GC_DEBUG, "1")
    monkeypatch.setattr(gc_heap, "DEBUG_MIN_MS", 0.0)
    try:
        assert gc_heap.install_gc_debug()
        assert gc_heap.install_gc_debug()  # twice: still one callback
        assert gc.callbacks.count(gc_heap._log_pause) == 1
        with caplog.at_level(logging.WARNING, logger=gc_heap.__name__):
            gc.collect()
        assert any("gc: generation 2 took" in r.getMessage() for r in caplog.records)
    finally:
        gc.callbacks.remove(gc_heap._log_pause)


def test_debug_is_off_by_default(monkeypatch):
    monkeypatch.delenv(gc_heap.ENV_GC_DEBUG, raising=False)
    assert not gc_heap.install_gc_debug()
    assert gc_heap._log_pause not in gc.callbacks
