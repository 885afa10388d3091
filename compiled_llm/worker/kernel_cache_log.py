"""How many Triton kernels a start-up compiled, phase by phase: new entries in the Triton cache
directories (Triton's own default and the one Inductor sets), counted before and after each
phase, so the log shows where a warm start still compiles (GPU only; a directory listing)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)


def triton_cache_dirs() -> list[Path]:
    """Triton's cache directories: $TRITON_CACHE_DIR (set by Inductor once it loads a kernel)
    and Triton's default, as far as they exist."""
    dirs = []
    if os.environ.get("TRITON_CACHE_DIR"):
        dirs.append(Path(os.environ["TRITON_CACHE_DIR"]))
    try:
        from triton import knobs

        dirs.append(Path(knobs.cache.dir))
    except (ImportError, AttributeError):  # older Triton: its documented default
        dirs.append(Path.home() / ".triton" / "cache")
    return [d for i, d in enumerate(dirs) if d.is_dir() and d not in dirs[:i]]


class KernelCacheLog:
    """Counts the Triton cache's entries at each mark(); log() reports the new ones per phase."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.phases: dict[str, int] = {}
        self.late: dict[str, list[str]] = {}  # phase -> kernels compiled after the dry pass
        self._seen = self._entries() if enabled else set()

    def _entries(self) -> set[tuple[str, str]]:
        return {(str(d), entry.name) for d in triton_cache_dirs() for entry in os.scandir(d)}

    def mark(self, phase: str) -> None:
        """Close `phase`: the entries added since the previous mark are its compiles."""
        if self.enabled:
            now = self._entries()
            added = now - self._seen
            self.phases[phase] = len(added)
            if added and phase not in ("load", "precompile"):
                self.late[phase] = sorted(_kernel_names(added))
            self._seen = now

    def log(self) -> None:
        """One log line: kernels compiled per phase and the directories counted."""
        if self.enabled:
            logger.info("Triton kernels compiled during start-up: %s (cache dirs: %s)",
                        ", ".join(f"{k} {v}" for k, v in self.phases.items()),
                        ", ".join(str(d) for d in triton_cache_dirs()))
            if self.late:  # the kernels a cold start's dry pass did not foresee
                logger.info("Triton kernels compiled during start-up, by name: %s",
                            "; ".join(f"{k}: {', '.join(v)}" for k, v in self.late.items()))


def _kernel_names(entries: set[tuple[str, str]]) -> list[str]:
    """What these cache entries hold: a kernel's <name>.json beside its binaries, else the
    files' names (a launcher's __triton_launcher.so, built at a kernel's first launch)."""
    names = []
    for directory, entry in entries:
        path = Path(directory, entry)
        files = sorted(child.name for child in path.iterdir()) if path.is_dir() else [entry]
        kernels = [name[:-5] for name in files
                   if name.endswith(".json") and not name.startswith("__grp__")]
        names.extend(kernels or files)
    return names
