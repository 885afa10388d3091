"""What an engine core's interpreter spends before it can build the engine (issue 14, item 5):
the core's imports as one fresh process (`-X importtime`, self time summed by package), the
same imports in N processes at once (as `serve` starts its core beside its API servers),
`import torch` with the first CUDA tensor, how much of torch, sympy and networkx has cached
bytecode, and the imports twice with a writable PYTHONPYCACHEPREFIX.

    python -m benchmarks.import_profile --json bench_out/import_profile.json --concurrent 5
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import print_table, save_json

# what the engine core process imports before it builds the engine (core_proc.launch)
CORE_IMPORTS = ("import compiled_llm.engine.core_proc, compiled_llm.worker.early_load, "
                "compiled_llm.engine.core, compiled_llm.compile, compiled_llm.passes.manager, "
                "torch._inductor.compile_fx; from torch._inductor import CompiledArtifact")
TORCH_AND_DEVICE = ("import time; t = time.perf_counter(); import torch; a = time.perf_counter(); "
                    "torch.zeros(1, device='cuda' if torch.cuda.is_available() else 'cpu'); "
                    "print(a - t, time.perf_counter() - a)")


# the baseline rows: Python's own bytecode settings, as without compiled_llm's bytecode cache
# (which `import compiled_llm` would otherwise turn on in the child)
BASELINE_ENV = {"COMPILED_LLM_BYTECODE_CACHE": "0"}


def timed_process(code: str, *flags: str, env: dict | None = None) -> tuple[float, str]:
    """(wall seconds, stderr) of `python <flags> -c code` in a fresh interpreter (env: on top
    of BASELINE_ENV)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True,
                          check=True, env={**os.environ, **BASELINE_ENV, **(env or {})})
    return time.perf_counter() - started, done.stderr + done.stdout


def by_package(importtime: str, top: int) -> list[dict]:
    """-X importtime's self times summed per package (torch's per subpackage), largest first."""
    totals: dict[str, int] = {}
    for line in importtime.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _, name = line.split(":", 1)[1].split("|")
        parts = name.strip().split(".")
        package = ".".join(parts[:2]) if parts[0] == "torch" else parts[0]
        totals[package] = totals.get(package, 0) + int(self_us)
    ranked = sorted(totals.items(), key=lambda item: -item[1])
    return [{"package": name, "self s": micros / 1e6} for name, micros in ranked[:top]]


def bytecode_cached(package: str) -> dict:
    """Of one installed package's .py files: how many have this interpreter's cached .pyc,
    and whether its directory is writable (where a missing .pyc would be written)."""
    root = Path(importlib.util.find_spec(package).origin).parent
    sources = list(root.rglob("*.py"))
    cached = sum(Path(importlib.util.cache_from_source(str(src))).is_file() for src in sources)
    return {"package": package, "py files": len(sources), "with .pyc": cached,
            "writable": os.access(root, os.W_OK)}


def with_pycache_prefix() -> list[float]:
    """The core's imports twice with bytecode written under a fresh PYTHONPYCACHEPREFIX."""
    with tempfile.TemporaryDirectory() as prefix:
        env = {"PYTHONPYCACHEPREFIX": prefix, "PYTHONDONTWRITEBYTECODE": "",
               "COMPILED_LLM_BYTECODE_CACHE": "1"}
        return [timed_process(CORE_IMPORTS, env=env)[0] for _ in range(2)]


def concurrent_walls(code: str, count: int) -> list[float]:
    """Wall seconds of `count` interpreters importing `code` at once."""
    started = time.perf_counter()
    env = {**os.environ, **BASELINE_ENV}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env) for _ in range(count)]
    walls = []
    for proc in procs:
        proc.wait()
        walls.append(time.perf_counter() - started)
    return walls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrent", type=int, default=5)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", default="bench_out/import_profile.json")
    args = ap.parse_args()
    timed_process("import torch")  # the first run reads the libraries from disk: not timed
    torch_s, device_s = map(float, timed_process(TORCH_AND_DEVICE)[1].split())
    alone_s, trace = timed_process(CORE_IMPORTS, "-X", "importtime")
    plain_s, _ = timed_process(CORE_IMPORTS)
    walls = concurrent_walls(CORE_IMPORTS, args.concurrent)
    packages = by_package(trace, args.top)
    bytecode = [bytecode_cached(name) for name in ("torch", "sympy", "networkx")]
    prefixed = with_pycache_prefix()
    print(f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE')!r}, "
          f"sys.flags.dont_write_bytecode={sys.flags.dont_write_bytecode}; the core's imports "
          f"with a fresh PYTHONPYCACHEPREFIX: {prefixed[0]:.2f} s, again {prefixed[1]:.2f} s")
    print_table(bytecode, "Cached bytecode of the largest pure-Python imports")
    print(f"import torch {torch_s:.2f} s, first device tensor {device_s:.2f} s; the core's "
          f"imports alone {plain_s:.2f} s (traced {alone_s:.2f} s); {args.concurrent} at once: "
          + ", ".join(f"{wall:.2f}" for wall in walls))
    print_table(packages, "The engine core's imports, self time by package")
    save_json(args.json, {"import_torch_s": torch_s, "first_device_tensor_s": device_s,
                          "core_imports_s": plain_s, "core_imports_traced_s": alone_s,
                          "concurrent_walls_s": walls, "by_package": packages,
                          "dont_write_bytecode": sys.flags.dont_write_bytecode,
                          "bytecode": bytecode, "pycache_prefix_runs_s": prefixed})


if __name__ == "__main__":
    main()
