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

from compiled_llm.compile.counters import counters

logger = logging.getLogger(__name__)
ENV_DIR = "COMPILED_LLM_CACHE_DIR"
ENV_DISABLE = "COMPILED_LLM_DISABLE_CACHE"


def default_cache_root() -> Path:
    return Path(os.environ.get(ENV_DIR) or Path.home() / ".cache" / "compiled_llm")


def source_hash(*paths: Path) -> str:
    """Hash of every .py file under paths (sorted; a path may be one file), so an edit
    invalidates the cache."""
    h = hashlib.sha256()
    for d in map(Path, paths):
        for f in [d] if d.is_file() else sorted(d.rglob("*.py")):
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def cache_key(factors: dict) -> str:
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
        fd, tmp = tempfile.mkstemp(dir=self.dir, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(info, f, default=str)
        os.replace(tmp, self.dir / "info.json")

    @contextmanager
    def lock(self) -> Iterator[None]:
        with open(self.dir / ".lock", "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _paths(self, piece: str) -> tuple[Path, Path]:
        """(data, manifest); a piece's data is `.bin`, a blob's name carries its own suffix."""
        data = self.dir / (piece if "." in piece else f"{piece}.bin")
        return data, self.dir / f"{piece}.json"

    def load(self, piece: str):
        """The stored artifact, or None on a miss or a corrupt entry (which is removed)."""
        art, manifest = self._paths(piece)
        if not manifest.exists():
            counters.cache_misses += 1
            return None
        try:
            meta = json.loads(manifest.read_text())
            if _sha(art) != meta["sha256"]:
                raise ValueError("checksum mismatch")
            from torch._inductor import CompiledArtifact

            loaded = CompiledArtifact.load(path=str(art), format="binary")
        except Exception as e:  # any damage means: rebuild, never crash
            self.discard(piece, e)
            counters.cache_misses += 1
            return None
        counters.cache_hits += 1
        return loaded

    def save(self, piece: str, artifact, info: dict | None = None) -> None:
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
        except Exception as e:
            self.discard(name, e)
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
        fd, tmp = tempfile.mkstemp(dir=self.dir, suffix=".tmp")
        os.close(fd)
        write(tmp)
        meta = {"sha256": _sha(Path(tmp)), "bytes": Path(tmp).stat().st_size, **(info or {})}
        os.replace(tmp, art)
        fd, tmp = tempfile.mkstemp(dir=self.dir, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(meta, f)
        os.replace(tmp, manifest)  # the manifest commits the entry


def list_entries(root: Path | str | None = None) -> list[dict]:
    """Every cache key directory with its piece count and size."""
    root = Path(root or default_cache_root())
    out = []
    for d in sorted(p for p in root.glob("*") if p.is_dir()) if root.exists() else []:
        files = list(d.glob("*.bin"))
        info = d / "info.json"
        out.append({"key": d.name, "pieces": len(files),
                    "bytes": sum(f.stat().st_size for f in files),
                    "info": json.loads(info.read_text()) if info.exists() else {}})
    return out


def clear(root: Path | str | None = None) -> int:
    root = Path(root or default_cache_root())
    n = len(list_entries(root))
    if root.exists():
        shutil.rmtree(root)
    return n
