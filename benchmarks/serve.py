"""Online serving benchmark on vLLM's `bench serve` conventions: a random dataset of token-id
prompts (input/output lengths with a range ratio, ignore_eos), Poisson arrivals at
--request-rate (inf = all at once), at most --max-concurrency in flight, streamed over
/v1/completions. Reports request and token throughput and TTFT, TPOT, ITL (mean, p50, p99);
writes a JSON result and a PNG plot.

    python -m benchmarks.serve --num-prompts 200 --random-input-len 128 \
        --random-output-len 64 --max-concurrency 32 --result-file out/serve.json

Without --base-url it starts `compiled-llm serve` itself (on --model, by default the embedded
demo model, else a random cpu-small checkpoint with the test tokenizer) and stops it after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Result:
    ok: bool = False
    prompt_len: int = 0
    output_tokens: int = 0
    start: float = 0.0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""


def random_dataset(n: int, in_len: int, out_len: int, ratio: float, vocab: int, seed: int):
    """(prompt token ids, max_tokens) pairs; lengths uniform in [len*(1-ratio), len*(1+ratio)]."""
    rng = random.Random(seed)

    def length(x: int) -> int:
        return max(1, rng.randint(int(x * (1 - ratio)), int(x * (1 + ratio))))

    return [([rng.randrange(1, vocab) for _ in range(length(in_len))], length(out_len))
            for _ in range(n)]


async def one_request(client: httpx.AsyncClient, url: str, body: dict) -> Result:
    res = Result(prompt_len=len(body["prompt"]), start=time.perf_counter())
    last = res.start
    try:
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                res.error = (await r.aread()).decode()[:200]
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                now = time.perf_counter()
                if chunk.get("usage"):
                    res.output_tokens = chunk["usage"]["completion_tokens"]
                if not chunk.get("choices"):  # each chunk carries >= 1 new token
                    continue
                if res.ttft == 0.0:
                    res.ttft = now - res.start
                else:
                    res.itl.append(now - last)
                last = now
        res.latency = time.perf_counter() - res.start
        res.ok = res.output_tokens > 0
    except httpx.HTTPError as e:
        res.error = repr(e)
    return res


async def run_load(base_url: str, model: str, data, rate: float, concurrency: int | None,
                   extra: dict | None = None, seed: int = 0) -> tuple[list[Result], float]:
    """Send every request (Poisson arrivals at rate; a cap on requests in flight)."""
    rng = np.random.default_rng(seed)
    sem = asyncio.Semaphore(concurrency or len(data))
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=None, limits=limits,
                                 headers=_auth_headers()) as client:
        async def limited(body: dict) -> Result:
            async with sem:
                return await one_request(client, f"{base_url}/v1/completions", body)

        tasks = []
        start = time.perf_counter()
        for prompt, max_tokens in data:
            body = {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                    "temperature": 0.0, "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}, **(extra or {})}
            tasks.append(asyncio.create_task(limited(body)))
            if rate != float("inf"):
                await asyncio.sleep(rng.exponential(1.0 / rate))
        results = await asyncio.gather(*tasks)
        return results, time.perf_counter() - start


def _auth_headers() -> dict:
    key = os.environ.get("OPENAI_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def summarize(results: list[Result], duration: float) -> dict:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    ms = lambda xs: np.asarray(xs, dtype=np.float64) * 1000.0  # noqa: E731
    ttft = ms([r.ttft for r in ok])
    tpot = ms([(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1])
    itl = ms([x for r in ok for x in r.itl])
    summary = {
        "completed": len(ok), "failed": len(results) - len(ok), "duration_s": duration,
        "request_throughput": len(ok) / duration,
        "output_throughput": out_tokens / duration,
        "total_token_throughput": (out_tokens + sum(r.prompt_len for r in ok)) / duration,
        "total_output_tokens": out_tokens,
    }
    for name, xs in (("ttft", ttft), ("tpot", tpot), ("itl", itl)):
        for stat, fn in (("mean", np.mean), ("median", np.median),
                         ("p99", lambda a: np.percentile(a, 99))):
            summary[f"{stat}_{name}_ms"] = float(fn(xs)) if len(xs) else float("nan")
    errors = [r.error for r in results if r.error]
    if errors:
        summary["first_error"] = errors[0]
    return summary


def print_summary(s: dict, title: str) -> None:
    print(f"\n{'=' * 16} {title} {'=' * 16}")
    for k, v in s.items():
        print(f"{k:<28} {v:,.2f}" if isinstance(v, float) else f"{k:<28} {v}")


def plot(results: list[Result], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results if r.ok]
    t0 = min(r.start for r in ok)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    axes[0].hist([r.ttft * 1000 for r in ok], bins=30)
    axes[0].set(title="TTFT", xlabel="ms", ylabel="requests")
    axes[1].hist([x * 1000 for r in ok for x in r.itl], bins=50)
    axes[1].set(title="Inter-token latency", xlabel="ms", ylabel="chunks")
    axes[2].scatter([r.start - t0 for r in ok], [r.latency for r in ok], s=6)
    axes[2].set(title="End-to-end latency by start time", xlabel="start (s)", ylabel="s")
    fig.suptitle(title)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def default_model() -> str:
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
    ap.add_argument("--base-url", default=None, help="a running server (else one is started)")
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokenizer", default=None, help="local tokenizer dir (default: --model)")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--server-args", default="", help="extra `compiled-llm serve` flags")
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--random-input-len", type=int, default=128)
    ap.add_argument("--random-output-len", type=int, default=64)
    ap.add_argument("--random-range-ratio", type=float, default=0.5)
    ap.add_argument("--request-rate", type=float, default=float("inf"))
    ap.add_argument("--max-concurrency", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--result-file", default=None)
    ap.add_argument("--plot", default=None, help="PNG path (default: next to --result-file)")


def serving(ns: argparse.Namespace):
    """(base_url, model name, server process or None) for the run."""
    if ns.base_url:
        models = httpx.get(f"{ns.base_url}/v1/models", headers=_auth_headers()).json()
        return ns.base_url.rstrip("/"), models["data"][0]["id"], None
    model = ns.model or default_model()
    proc = start_server(model, ns.port, ns.server_args.split())
    return f"http://127.0.0.1:{ns.port}", model, proc


def vocab_size(tokenizer: str) -> int:
    """Prompt ids are drawn from the tokenizer's vocabulary (a local path)."""
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(tokenizer))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_args(ap)
    ns = ap.parse_args()
    base_url, model, proc = serving(ns)
    try:
        data = random_dataset(ns.num_prompts, ns.random_input_len, ns.random_output_len,
                              ns.random_range_ratio, vocab_size(ns.tokenizer or model), ns.seed)
        asyncio.run(run_load(base_url, model, data[:4], float("inf"), None))  # warm up
        results, duration = asyncio.run(run_load(base_url, model, data, ns.request_rate,
                                                 ns.max_concurrency, seed=ns.seed))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()
    summary = summarize(results, duration)
    config = {k: v for k, v in vars(ns).items() if k not in ("result_file", "plot")}
    print_summary(summary, "Serving Benchmark Result")
    if ns.result_file:
        Path(ns.result_file).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.result_file).write_text(json.dumps({"config": config, **summary}, indent=2))
    png = ns.plot or (str(Path(ns.result_file).with_suffix(".png")) if ns.result_file else None)
    if png:
        plot(results, png, f"{ns.num_prompts} prompts, rate {ns.request_rate}, "
                           f"concurrency {ns.max_concurrency}")


if __name__ == "__main__":
    main()
