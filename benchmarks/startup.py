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
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.common import print_table, save_json, shape_checkpoint

CLI = [sys.executable, "-m", "compiled_llm.entrypoints.cli"]


def compile_process(model: str, cache: Path, inductor: Path, out: Path) -> dict:
    """One `compiled-llm compile` process: its wall time and what it reported."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(inductor)}
    # its output to files, not pipes: the wall time ends when the process does, not when the
    # last process that inherited its output (a compile child still exiting) closes it
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        started = time.perf_counter()
        proc = subprocess.Popen([*CLI, "compile", "--model", model, "--compile-cache-dir",
                                 str(cache), "--output-json", str(out)], env=env,
                                stdout=stdout, stderr=stderr, start_new_session=True)
        proc.wait()
        wall = time.perf_counter() - started
        _wait_group_gone(proc.pid, 60.0)
        stderr.seek(0)
        log = stderr.read()
    if proc.returncode:
        raise RuntimeError(f"compiled-llm compile exited {proc.returncode}:\n{log[-4000:]}")
    # the start-up lines of its log (Triton compiles per phase, the weights phase, shutdown)
    notes = [line for line in log.splitlines()
             if any(mark in line for mark in ("Triton kernels compiled", "weights phase",
                                              "Inductor piece", "shut down"))]
    print("\n".join(notes))
    return {"wall s": wall, **json.loads(out.read_text()), "log": notes}


def _wait_group_gone(group: int, timeout_s: float) -> None:
    """Untimed: until every process the compile left (its session) has exited, so that the
    next row neither shares the CPUs with them nor sizes its KV cache beside their contexts."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.05)


def _stamp_lines(stream, sink, started: float) -> None:
    """Copy the server's output to sink, each line prefixed by seconds since its spawn."""
    for raw in iter(stream.readline, b""):
        sink.write(f"+{time.perf_counter() - started:7.2f}s ".encode() + raw)
        sink.flush()


def serve_first_token(model: str, cache: Path, inductor: Path, port: int,
                      extra: list[str], env_extra: dict[str, str] | None = None,
                      log_name: str = "serve.log") -> float:
    """Seconds from spawning `compiled-llm serve` to the end of its first one-token reply;
    the server's output goes to log_name with each line stamped (its timeline)."""
    import httpx

    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(inductor), **(env_extra or {})}
    log = cache.parent / log_name
    started = time.perf_counter()
    server = subprocess.Popen([*CLI, "serve", "--model", model, "--port", str(port),
                               "--compile-cache-dir", str(cache), *extra], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    sink = log.open("wb")
    copier = threading.Thread(target=_stamp_lines, args=(server.stdout, sink, started),
                              daemon=True)
    copier.start()
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
                copier.join(5)
                tail = log.read_text(errors="replace")[-4000:]
                raise RuntimeError(f"server exited with {server.returncode}; its log:\n{tail}")
            time.sleep(0.05)
    finally:
        server.terminate()
        server.wait(60)
        copier.join(5)
        sink.close()


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


def serve_variants(model: str, cache: Path, inductor: Path, args) -> dict:
    """The warm serve row again under each --serve-env KEY=VALUE (or, for a setting that
    starts with "--", with those serve flags added): seconds and the log tail."""
    out = {}
    for index, setting in enumerate(args.serve_env):
        flags, env = [], {}
        if setting.startswith("--"):
            flags = shlex.split(setting)
        else:
            key, _, value = setting.partition("=")
            env = {key: value}
        name = f"serve_variant{index}.log"
        try:
            seconds = serve_first_token(model, cache, inductor, args.port,
                                        [*args.serve_args, *flags], env, name)
        except RuntimeError as err:
            out[setting] = {"error": str(err)}
            continue
        log = (cache.parent / name).read_text(errors="replace").splitlines()
        print(f"warm serve with {setting}, spawn to first token: {seconds:.1f} s")
        print("\n".join(log[-40:]))
        out[setting] = {"serve_first_token_s": seconds, "serve_log": log[-200:]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama3-8b")
    ap.add_argument("--checkpoint-dir", default=None)
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--json", default=None)
    ap.add_argument("--serve-env", nargs="*", default=[], metavar="KEY=VALUE",
                    help="after the default serve row, one more warm serve row per setting "
                    "(an environment variable, or serve flags when it starts with --)")
    ap.add_argument("--serve-only", action="store_true",
                    help="one cold compile (it fills the cache), then only the serve rows")
    ap.add_argument("--cold-only", action="store_true",
                    help="one cold compile and nothing else (A/B rows of the cold start)")
    ap.add_argument("--serve-args", nargs=argparse.REMAINDER, default=[],
                    help="more `compiled-llm serve` flags for the serve row (last)")
    args = ap.parse_args()
    model = shape_checkpoint(args.shape, args.checkpoint_dir, tokenizer=True)
    work = Path(tempfile.mkdtemp(prefix="startup-"))
    cache, inductor, moved = work / "cache", work / "inductor", work / "moved"
    runs = {"cold compile": compile_process(model, cache, inductor, work / "cold.json")}
    if not (args.serve_only or args.cold_only):
        runs["warm compile"] = compile_process(model, cache, inductor, work / "warm.json")
        shutil.copytree(cache, moved)
        runs["warm, cache copied elsewhere"] = compile_process(model, moved, inductor,
                                                               work / "moved.json")
    rows = [_row(name, res) for name, res in runs.items()]
    print_table(rows, f"Start-up as whole processes, {args.shape}")
    if "warm compile" in runs:
        cold, warm = runs["cold compile"]["wall s"], runs["warm compile"]["wall s"]
        print(f"cold / warm (compile processes): {cold / warm:.2f}x")
    result = {"rows": rows, "runs": runs}
    if not args.cold_only:
        result.update(_serve_rows(model, cache, inductor, work, args))
    save_json(args.json or f"bench_out/startup_{args.shape}.json", result)
    shutil.rmtree(work, ignore_errors=True)


def _serve_rows(model: str, cache: Path, inductor: Path, work: Path, args) -> dict:
    """The warm serve from the cache the compiles filled, then its variants; a failed serve is
    reported in the result (its log says why), the compile rows stand."""
    result: dict = {}
    try:
        serve_s = serve_first_token(model, cache, inductor, args.port, args.serve_args)
        print(f"warm serve, spawn to first token: {serve_s:.1f} s")
        # the server's timeline: every log line stamped with seconds since the spawn
        log = (work / "serve.log").read_text(errors="replace").splitlines()
        print("\n".join(log[-60:]))
        result.update(serve_first_token_s=serve_s, serve_log=log[-200:])
    except RuntimeError as err:
        print(f"warm serve failed: {err}")
        result["serve_error"] = str(err)
    result["serve_variants"] = serve_variants(model, cache, inductor, args)
    return result

if __name__ == "__main__":
    main()
