"""The bytecode cache of the engine's processes: on only where torch's bytecode is neither kept
nor going to be written beside its source, and then the bytecode of what a process imports
lands under the compile cache root, for it and its children."""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

from compiled_llm import bytecode_cache

ROOT = Path(__file__).resolve().parents[1]


def fake_torch(tmp_path: Path, compiled: bool) -> Path:
    """A package named torch with the probe module (its bytecode cached if `compiled`)."""
    probe = tmp_path / "site" / "torch" / "_inductor" / "compile_fx.py"
    probe.parent.mkdir(parents=True)
    (probe.parents[1] / "__init__.py").write_text("")
    (probe.parent / "__init__.py").write_text("")
    probe.write_text("VALUE = 42\n")
    if compiled:
        py_compile.compile(str(probe), cfile=bytecode_cache.importlib.util.cache_from_source(
            str(probe)))
    return probe


@pytest.fixture
def settings(monkeypatch, tmp_path):
    """No prefix set, bytecode writing off, the cache root in tmp_path."""
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.delenv(bytecode_cache.SWITCH_ENV, raising=False)
    monkeypatch.setenv(bytecode_cache.CACHE_DIR_ENV, str(tmp_path / "cache"))
    return monkeypatch


def test_prefix_where_torch_bytecode_is_missing_and_not_written(settings, tmp_path):
    probe = fake_torch(tmp_path, compiled=False)
    settings.setattr(bytecode_cache, "_torch_probe", lambda: probe)
    assert bytecode_cache.bytecode_prefix() == str(tmp_path / "cache" / "pycache")
    assert (tmp_path / "cache" / "pycache").is_dir()


def test_no_prefix_where_python_keeps_or_writes_it(settings, tmp_path):
    cached = fake_torch(tmp_path / "a", compiled=True)
    settings.setattr(bytecode_cache, "_torch_probe", lambda: cached)
    assert bytecode_cache.bytecode_prefix() is None  # cached beside the source
    bare = fake_torch(tmp_path / "b", compiled=False)
    settings.setattr(bytecode_cache, "_torch_probe", lambda: bare)
    settings.setattr(sys, "dont_write_bytecode", False)
    assert bytecode_cache.bytecode_prefix() is None  # the first import writes it


def test_switch_and_a_users_prefix_win(settings, tmp_path):
    probe = fake_torch(tmp_path, compiled=False)
    settings.setattr(bytecode_cache, "_torch_probe", lambda: probe)
    settings.setenv(bytecode_cache.SWITCH_ENV, "0")
    assert bytecode_cache.bytecode_prefix() is None
    settings.delenv(bytecode_cache.SWITCH_ENV)
    settings.setattr(sys, "pycache_prefix", str(tmp_path / "mine"))
    assert bytecode_cache.bytecode_prefix() is None


def test_enable_never_fails_an_import(settings, tmp_path):
    def broken():
        raise ValueError("torch.__spec__ is None")

    settings.setattr(bytecode_cache, "_torch_probe", broken)
    assert bytecode_cache.enable() is None and sys.pycache_prefix is None


def test_cache_ls_skips_the_bytecode(tmp_path):
    from compiled_llm.compile import cache

    (tmp_path / bytecode_cache.PYCACHE_DIRNAME).mkdir()
    (tmp_path / "somekey").mkdir()
    assert [entry["key"] for entry in cache.list_entries(tmp_path)] == ["somekey"]


def test_enabled_process_and_its_child_keep_bytecode_under_the_prefix(tmp_path):
    """A process with writing off and an uncompiled torch: `import compiled_llm` sets the
    prefix, the probe module's bytecode is written under it, and a child inherits it."""
    fake_torch(tmp_path, compiled=False)
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", bytecode_cache.CACHE_DIR_ENV: str(cache),
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(ROOT)])}
    env.pop("PYTHONPYCACHEPREFIX", None)
    env.pop(bytecode_cache.SWITCH_ENV, None)
    code = ("import subprocess, sys\n"
            "import compiled_llm  # enables it\n"
            "print(sys.pycache_prefix)\n"
            "import torch._inductor.compile_fx\n"
            "subprocess.run([sys.executable, '-c', 'import sys; print(sys.pycache_prefix, "
            "sys.flags.dont_write_bytecode)'], check=True)\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True)
    prefix = cache / "pycache"
    assert done.stdout.split("\n")[:2] == [str(prefix), f"{prefix} 0"]
    written = [path.name for path in prefix.rglob("compile_fx*.pyc")]
    assert written and not list((tmp_path / "site").rglob("*.pyc"))
