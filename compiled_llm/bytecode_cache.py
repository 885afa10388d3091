"""Cached Python bytecode for the engine's processes where Python would keep none: told not to
write .pyc files (PYTHONDONTWRITEBYTECODE) beside a torch installed without them, every process
compiles torch, sympy and Inductor from source at each start. Then the bytecode goes under the
compile cache root (PYTHONPYCACHEPREFIX; COMPILED_LLM_BYTECODE_CACHE=0 leaves Python's settings
alone). Enabled on `import compiled_llm`, before torch is imported; no torch here."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

SWITCH_ENV = "COMPILED_LLM_BYTECODE_CACHE"
CACHE_DIR_ENV = "COMPILED_LLM_CACHE_DIR"
PYCACHE_DIRNAME = "pycache"  # under the compile cache root; `cache ls` skips it
HINTS_DIRNAME = "warm-hints"  # worker/warm_hint.py's, under the root too; skipped as well
# torch's largest module, which every engine core imports: whether its bytecode is cached
# stands for torch's (and so for most of a start's imports)
PROBE = ("_inductor", "compile_fx.py")


def bytecode_prefix() -> str | None:
    """The directory this process's imports should keep their bytecode in, or None where
    Python keeps (or will write) torch's beside its sources, a prefix is already set, the
    switch is off, or no directory can be made."""
    if os.environ.get(SWITCH_ENV) == "0" or sys.pycache_prefix:
        return None
    probe = _torch_probe()
    if probe is None or not _uncached(probe):
        return None
    prefix = cache_root() / PYCACHE_DIRNAME
    prefix.mkdir(parents=True, exist_ok=True)
    return str(prefix)


def cache_root() -> Path:
    """The compile cache's root: $COMPILED_LLM_CACHE_DIR, else ~/.cache/compiled_llm (here,
    torch-free, so that the bytecode can live under it before torch is imported)."""
    return Path(os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache" / "compiled_llm")


def _uncached(source: Path) -> bool:
    """Whether source has no cached bytecode beside it and the next import will not write it."""
    if Path(importlib.util.cache_from_source(str(source))).is_file():
        return False
    return sys.dont_write_bytecode or not os.access(source.parent, os.W_OK)


def _torch_probe() -> Path | None:
    """The installed torch's PROBE file (found without importing torch), or None."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    probe = Path(spec.origin).parent.joinpath(*PROBE)
    return probe if probe.is_file() else None


def enable() -> str | None:
    """Keep this process's (and its children's) bytecode under bytecode_prefix(); the prefix,
    or None where nothing changed (also on any error: a speed-up never fails an import).
    For a process's entry point, before torch is imported."""
    try:
        prefix = bytecode_prefix()
    except Exception:  # noqa: BLE001 (no home directory, a torch stub without a spec ...)
        return None
    if prefix is not None:
        sys.pycache_prefix = prefix
        sys.dont_write_bytecode = False
        os.environ["PYTHONPYCACHEPREFIX"] = prefix
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    return prefix
