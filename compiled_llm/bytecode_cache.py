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
# the compile cache's root (compile/cache.py's default_cache_root, which imports torch)
CACHE_DIR_ENV = "COMPILED_LLM_CACHE_DIR"
# large modules every engine core imports (package, path inside it): whether their bytecode is
# cached stands for the compiler stack's
PROBES = (("torch", ("_inductor", "compile_fx.py")), ("sympy", ("core", "basic.py")),
          ("networkx", ("classes", "graph.py")))


def bytecode_prefix() -> str | None:
    """The directory this process's imports should keep their bytecode in, or None where
    Python keeps (or will write) it beside the sources, a prefix is already set, or the
    switch is off."""
    if os.environ.get(SWITCH_ENV) == "0" or sys.pycache_prefix:
        return None
    if not any(_uncached(probe) for probe in _probe_files()):
        return None
    root = Path(os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache" / "compiled_llm")
    prefix = root / "pycache"
    try:
        prefix.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return str(prefix)


def _uncached(source: Path) -> bool:
    """Whether source has no cached bytecode beside it and the next import will not write it."""
    if Path(importlib.util.cache_from_source(str(source))).is_file():
        return False
    return sys.dont_write_bytecode or not os.access(source.parent, os.W_OK)


def _probe_files() -> list[Path]:
    """The PROBES files of the installed packages (found without importing them)."""
    files = []
    for package, parts in PROBES:
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.origin is not None:
            files.append(Path(spec.origin).parent.joinpath(*parts))
    return [probe for probe in files if probe.is_file()]


def child_env(prefix: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """base (default: this process's environment) for a child interpreter that keeps its
    bytecode under prefix."""
    env = {**(os.environ if base is None else base), "PYTHONPYCACHEPREFIX": prefix}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def enable() -> str | None:
    """Keep this process's (and its children's) bytecode under bytecode_prefix(); the prefix,
    or None where nothing changed. For a process's entry point, before torch is imported."""
    prefix = bytecode_prefix()
    if prefix is not None:
        sys.pycache_prefix = prefix
        sys.dont_write_bytecode = False
        os.environ["PYTHONPYCACHEPREFIX"] = prefix
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    return prefix
