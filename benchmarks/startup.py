"""Start-up as whole processes (issue 14, item 5): `compiled-llm compile` cold (empty compile
cache and Inductor cache) and warm (both kept), warm again from a copy of the cache in another
directory (the cache is movable), and `compiled-llm serve` from spawn to the end of its first
one-token response, warm. Each row is one fresh process; its phases come from the engine.

    python -m benchmarks.startup --shape llama3-8b --checkpoint-dir /tmp/ckpt
    python -m benchmarks.startup --shape cpu-small
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import print_table, save_json, shape_checkpoint

CLI = [sys.executable, "-m", "compiled_llm.entrypoints.cli"]


def compile_process(model: str, cache: Path, inductor: Path, out: Path) -> dict:
    """One `compiled-llm compile` process: its wall time and what it reported."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(inductor)}
    started = time.perf_counter()
    subprocess.run([*CLI, "compile", "--model", model, "--compile-cache-dir", str(cache),
                    "--output-json", str(out)], env=env, check=True, capture_output=True)
    wall = time.perf_counter() - started
    return {"wall s": wall, **json.loads(out.read_text())}


def serve_first_token(model: str, cache: Path, inductor: Path, port: int) -> float:
    """Seconds from spawning `compiled-llm serve` to the end of its first one-token reply."""
    import httpx

    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(inductor)}
    log = cache.parent / "serve.log"
    started = time.perf_counter()
    with log.open("wb") as sink:
        server = subprocess.Popen([*CLI, "serve", "--model", model, "--port", str(port),
                                   "--compile-cache-dir", str(cache)], env=env,
                                  stdout=sink, stderr=subprocess.STDOUT)
    body = {"model": model, "prompt": [1, 2, 3], "max_tokens": 1, "temperature": 0.0}
    try:
        while True:
            try:
                reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body,
                                   timeout=30)
                if reply.status_code == 200:
                    return time.perf_counter() - started
            except httpx.TransportError:
                pass
            if server.poll() is not None:
                tail = log.read_text(errors="replace")[-4000:]
                raise RuntimeError(f"server exited with {server.returncode}; its log:\n{tail}")
            time.sleep(0.05)
    finally:
        server.terminate()
        server.wait(60)


def _row(name: str, res: dict) -> dict:
    phases = res.get("startup", {})
    return {"run": name, "process wall s": res["wall s"],
            "before engine s": phases.get("before_engine", float("nan")),
            "weights s": phases.get("load", float("nan")),
            "compile s": phases.get("compile_and_profile", float("nan")),
            "graphs s": phases.get("cudagraphs", float("nan")),
            "ready (total) s": phases.get("total", float("nan")),
            "first request s": phases.get("first_request", float("nan")),
            "inductor compiles": res.get("inductor_compiles"), "cache hits": res.get("cache_hits")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama3-8b")
    ap.add_argument("--checkpoint-dir", default=None)
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    model = shape_checkpoint(args.shape, args.checkpoint_dir, tokenizer=True)
    work = Path(tempfile.mkdtemp(prefix="startup-"))
    cache, inductor, moved = work / "cache", work / "inductor", work / "moved"
    runs = {"cold compile": compile_process(model, cache, inductor, work / "cold.json"),
            "warm compile": compile_process(model, cache, inductor, work / "warm.json")}
    shutil.copytree(cache, moved)
    runs["warm, cache copied elsewhere"] = compile_process(model, moved, inductor,
                                                           work / "moved.json")
    rows = [_row(name, res) for name, res in runs.items()]
    cold, warm = runs["cold compile"]["wall s"], runs["warm compile"]["wall s"]
    print_table(rows, f"Start-up as whole processes, {args.shape}")
    print(f"cold / warm (compile processes): {cold / warm:.2f}x")
    result = {"rows": rows, "runs": runs}
    try:  # the compile rows stand even when serving fails (its log says why)
        serve_s = serve_first_token(model, cache, inductor, args.port)
        print(f"warm serve, spawn to first token: {serve_s:.1f} s")
        # the server's own start-up phases (its engine-ready lines): where the time went
        log = (work / "serve.log").read_text(errors="replace").splitlines()
        ready_lines = [line for line in log if "engine ready" in line or "capture" in line]
        print("\n".join(ready_lines))
        result.update(serve_first_token_s=serve_s, serve_log_ready_lines=ready_lines)
    except RuntimeError as err:
        print(f"warm serve failed: {err}")
        result["serve_error"] = str(err)
    save_json(args.json or f"bench_out/startup_{args.shape}.json", result)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
