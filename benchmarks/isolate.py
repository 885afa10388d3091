"""Run one benchmark function in a fresh Python process, so that each engine or peer model gets
the whole device and its own compiler state, and return its JSON-able result.

    python -m benchmarks.isolate benchmarks.hf_peer:prefill ARGS.json   # internal
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

MARK = "@@isolate-result@@"
ROOT = Path(__file__).resolve().parents[1]


def call(target: str, **kwargs) -> dict:
    """target(**kwargs) in a child process; {"error": last stderr line} if it fails. The
    child's stderr streams through (progress and warnings)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    # the arguments travel in a file: 256 prompts of 1k ids overflow a command line
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(kwargs, f)
    cmd = [sys.executable, "-m", "benchmarks.isolate", target, f.name]
    result, last = None, f"{target} failed"
    with subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True) as proc:
        for line in proc.stdout:
            if line.startswith(MARK):
                result = json.loads(line[len(MARK):])
            elif line.strip():
                print(line, end="", flush=True)
                last = line.strip()
    if proc.returncode != 0 or result is None:
        return {"error": f"{target.split(':')[1]}: {last} (exit code {proc.returncode})"}
    return result


def main() -> None:
    target, kwargs = sys.argv[1], json.loads(Path(sys.argv[2]).read_text())
    Path(sys.argv[2]).unlink()
    module, name = target.split(":")
    try:
        result = getattr(importlib.import_module(module), name)(**kwargs)
    except Exception as e:  # report it as the result's error; the parent goes on
        import traceback

        traceback.print_exc()
        print(f"{type(e).__name__}: {e}", flush=True)
        sys.exit(1)
    print(MARK + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
