"""Online serving benchmark: `compiled-llm bench serve` (its flags, its report and JSON result;
compiled_llm/entrypoints/cli/bench_serve.py), plus what a benchmark run wants around it: a
server started here when no --base-url is given, and a PNG plot of the per-request figures.

    python -m benchmarks.serve --num-prompts 200 --random-input-len 128 \\
        --random-output-len 64 --random-range-ratio 0.5 --max-concurrency 32 --ignore-eos \\
        --server-args "--enforce-eager --dtype float32" --result-filename out/serve.json

Without --base-url it starts `compiled-llm serve` itself on --port (on --model, by default the
embedded demo model, else a random cpu-small checkpoint with the test tokenizer) and stops it
after. The plot goes next to the JSON result (--plot to move it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from compiled_llm.entrypoints.cli.args import add_dataclass_args
from compiled_llm.entrypoints.cli.bench_serve import (
    ServeBenchArgs,
    run_bench_serve,
    served_model,
)

ROOT = Path(__file__).resolve().parents[1]


def plot(result: dict, path: str, title: str) -> None:
    """Histograms of TTFT, ITL and end-to-end latency from a bench serve result."""
    from benchmarks.common import save_plot

    def draw(plt):
        fig, axes = plt.subplots(1, 3, figsize=(15, 4))
        for ax, values, name, unit in (
                (axes[0], result["ttfts"], "TTFT", "requests"),
                (axes[1], [x for itl in result["itls"] for x in itl], "Inter-token latency",
                 "events"),
                (axes[2], result["e2els"], "End-to-end latency", "requests")):
            ax.hist([v * 1000 for v in values], bins=40)
            ax.set(title=name, xlabel="ms", ylabel=unit)
        fig.suptitle(title)
        return fig

    save_plot(path, draw)


def default_model() -> str:
    """The embedded demo model, else a random cpu-small checkpoint with the test tokenizer."""
    demo = ROOT / "compiled_llm" / "data" / "demo_model"
    if (demo / "config.json").exists():
        return str(demo)
    import shutil

    from benchmarks.common import random_checkpoint
    from tests.utils import tokenizer_dir

    out = random_checkpoint("cpu-small", out=str(ROOT / "bench_out" / "cpu-small"))
    for f in Path(tokenizer_dir()).iterdir():  # a 384-token tokenizer on a 4096-id model
        shutil.copy(f, out / f.name)
    return str(out)


def start_server(model: str, port: int, args: list[str]) -> subprocess.Popen:
    """`compiled-llm serve --model MODEL --port PORT ARGS`, once its /health answers."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "compiled_llm.entrypoints.cli", "serve", "--model", model,
           "--port", str(port), "--log-level", "warning", *args]
    proc = subprocess.Popen(cmd, env=env)
    for _ in range(900):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(1)
        if proc.poll() is not None:
            raise RuntimeError("server exited")
    proc.kill()
    raise RuntimeError("server did not start")


def add_args(ap: argparse.ArgumentParser) -> None:
    """bench serve's flags, and how to start a server when there is no --base-url."""
    ap.add_argument("--server-args", default="",
                    help="extra `compiled-llm serve` flags for the server started here")
    ap.add_argument("--plot", default=None, help="PNG path (default: next to the JSON result)")
    add_dataclass_args(ap, ServeBenchArgs, title="bench serve options")


def serving(ns: argparse.Namespace) -> subprocess.Popen | None:
    """Point ns at a server: the one at --base-url, else one started here (returned, for
    the caller to stop); ns.base_url and ns.model are filled in."""
    if ns.base_url:
        ns.model = ns.model or served_model(ns.base_url.rstrip("/"))
        return None
    ns.model = ns.model or default_model()
    proc = start_server(ns.model, ns.port, ns.server_args.split())
    ns.base_url = f"http://127.0.0.1:{ns.port}"
    return proc


def stop(proc: subprocess.Popen | None) -> None:
    """Stop a server serving() started."""
    if proc is not None:
        proc.terminate()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_args(ap)
    ns = ap.parse_args()
    proc = serving(ns)
    try:
        run_bench_serve(ns)
    finally:
        stop(proc)
    if ns.result_filename:
        path = Path(ns.result_dir or ".") / ns.result_filename
        plot(json.loads(path.read_text()), ns.plot or str(path.with_suffix(".png")),
             f"{ns.num_prompts} prompts, rate {ns.request_rate}, "
             f"concurrency {ns.max_concurrency}")


if __name__ == "__main__":
    main()
