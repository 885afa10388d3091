"""Two processes compiling the same model into one cache at once both succeed, and what they
leave is complete: a third start loads every piece from the cache."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.utils import make_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def _compile(ckpt, cache_dir):
    cmd = [sys.executable, "-m", "compiled_llm.entrypoints.cli", "compile", "--model", str(ckpt),
           "--cache-dir", str(cache_dir), "--dtype", "float32"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def test_concurrent_compiles_share_one_cache(tmp_path):
    ckpt = make_checkpoint("qwen3_deep")
    procs = [_compile(ckpt, tmp_path) for _ in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    compiled = [int(re.search(r"Inductor compiles (\d+)", o).group(1)) for o in outs]
    hits = [int(re.search(r"cache hits (\d+)", o).group(1)) for o in outs]
    assert sum(compiled) == 3 and sum(hits) == 3  # the lock: every piece compiled exactly once
    third = _compile(ckpt, tmp_path).communicate(timeout=600)[0]
    assert "Inductor compiles 0, cache hits 3" in third
    assert "corrupt" not in third
