"""On-disk compile cache: Inductor artifacts of each unique piece, keyed by everything that
changes the code (model config, dtype, compile and pass config, versions, sources).

Writes are atomic (temp file + rename, the manifest last), a file lock serialises compilers of
the same key, and a corrupt or truncated entry is detected by checksum, warned about, rebuilt.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from compiled_llm.bytecode_cache import HINTS_DIRNAME, PYCACHE_DIRNAME, cache_root
from compiled_llm.compile.counters import counters

logger = logging.getLogger(__name__)
ENV_DISABLE = "COMPILED_LLM_DISABLE_CACHE"
default_cache_root = cache_root  # $COMPILED_LLM_CACHE_DIR, else ~/.cache/compiled_llm


def source_hash(*paths: Path) -> str:
    """Hash of every .py file under paths (sorted; a path may be one file), so an edit
    invalidates the cache."""
    digest = hashlib.sha256()
    for root in map(Path, paths):
        for source in [root] if root.is_file() else sorted(root.rglob("*.py")):
            digest.update(source.name.encode())
            digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def cache_key(factors: dict) -> str:
    """The directory name for factors plus the torch and Triton versions."""
    versions = {"torch": torch.__version__, "triton": _triton_version()}
    blob = json.dumps({**factors, **versions}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _triton_version() -> str:
    try:
        import triton

        return triton.__version__
    except ImportError:
        return "none"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class CompileCache:
    """One directory per cache key; one artifact + manifest per unique piece."""

    def __init__(self, root: Path | str, key: str) -> None:
        self.dir = Path(root) / key
        self.dir.mkdir(parents=True, exist_ok=True)

    def write_info(self, info: dict) -> None:
        """A human-readable note of what this key is, for `compiled-llm cache ls`."""
        tmp_fd, tmp = tempfile.mkstemp(dir=self.dir, suffix=".tmp")
        with os.fdopen(tmp_fd, "w") as out:
            json.dump(info, out, default=str)
        os.replace(tmp, self.dir / "info.json")

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Hold this key's file lock (one compiler of a key at a time, across processes)."""
        with open(self.dir / ".lock", "w") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)

    def _paths(self, piece: str) -> tuple[Path, Path]:
        """(data, manifest); a piece's data is `.bin`, a blob's name carries its own suffix."""
        data = self.dir / (piece if "." in piece else f"{piece}.bin")
        return data, self.dir / f"{piece}.json"

    def has(self, piece: str) -> bool:
        """Whether an entry for piece is stored (not checked for damage)."""
        return self._paths(piece)[1].exists()

    def load(self, piece: str, count: bool = True):
        """The stored artifact, or None on a miss or a corrupt entry (which is removed);
        count=False leaves the hit/miss counters alone (a piece a compile child just built)."""
        art, manifest = self._paths(piece)
        if not manifest.exists():
            counters.cache_misses += count
            return None
        try:
            meta = json.loads(manifest.read_text())
            if _sha(art) != meta["sha256"]:
                raise ValueError("checksum mismatch")
            from torch._inductor import CompiledArtifact

            loaded = CompiledArtifact.load(path=str(art), format="binary")
        except Exception as exc:  # any damage means: rebuild, never crash
            self.discard(piece, exc)
            counters.cache_misses += count
            return None
        counters.cache_hits += count
        return loaded

    def save(self, piece: str, artifact, info: dict | None = None) -> None:
        """Store a piece's Inductor artifact (atomic; info joins its manifest)."""
        self._commit(piece, lambda tmp: artifact.save(path=tmp, format="binary"), info)

    def save_blob(self, name: str, data: bytes, info: dict | None = None) -> None:
        """Store raw bytes under name, with the same atomic commit and checksum as artifacts."""
        self._commit(name, lambda tmp: Path(tmp).write_bytes(data), info)

    def load_blob(self, name: str) -> bytes | None:
        """The bytes stored under name, or None when missing or corrupt (which is removed)."""
        art, manifest = self._paths(name)
        if not manifest.exists():
            return None
        try:
            data = art.read_bytes()
            if hashlib.sha256(data).hexdigest() != json.loads(manifest.read_text())["sha256"]:
                raise ValueError("checksum mismatch")
        except Exception as exc:
            self.discard(name, exc)
            return None
        return data

    def discard(self, name: str, why: object) -> None:
        """Drop a damaged entry (warned about) so the next run rebuilds it."""
        art, manifest = self._paths(name)
        logger.warning("compile cache entry %s is corrupt (%s); rebuilding", art, why)
        counters.cache_corrupt += 1
        art.unlink(missing_ok=True)
        manifest.unlink(missing_ok=True)

    def _commit(self, name: str, write, info: dict | None) -> None:
        art, manifest = self._paths(name)
        tmp_fd, tmp = tempfile.mkstemp(dir=self.dir, suffix=".tmp")
        os.close(tmp_fd)
        write(tmp)
        meta = {"sha256": _sha(Path(tmp)), "bytes": Path(tmp).stat().st_size, **(info or {})}
        os.replace(tmp, art)
        tmp_fd, tmp = tempfile.mkstemp(dir=self.dir, suffix=".tmp")
        with os.fdopen(tmp_fd, "w") as out:
            json.dump(meta, out)
        os.replace(tmp, manifest)  # the manifest commits the entry


def list_entries(root: Path | str | None = None) -> list[dict]:
    """Every cache key directory with its piece count and size."""
    root = Path(root or default_cache_root())
    entries = []
    key_dirs = (sorted(p for p in root.glob("*")
                      if p.is_dir() and p.name not in (PYCACHE_DIRNAME, HINTS_DIRNAME))
                if root.exists() else [])
    for key_dir in key_dirs:
        files = list(key_dir.glob("*.bin"))
        info = key_dir / "info.json"
        entries.append({"key": key_dir.name, "pieces": len(files),
                        "bytes": sum(f.stat().st_size for f in files),
                        "info": json.loads(info.read_text()) if info.exists() else {}})
    return entries


def clear(root: Path | str | None = None) -> int:
    """Delete the whole cache under root; returns how many keys it held."""
    root = Path(root or default_cache_root())
    num_entries = len(list_entries(root))
    if root.exists():
        shutil.rmtree(root)
    return num_entries
