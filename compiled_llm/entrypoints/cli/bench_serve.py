"""`compiled-llm bench serve`, shaped like vLLM's `vllm bench serve`: a random, ShareGPT or
custom dataset streamed to a running OpenAI-compatible server at a request rate (Poisson or
gamma arrivals) and concurrency, reported with vLLM's metric names and JSON keys (throughputs,
goodput; TTFT, TPOT, ITL, E2EL mean, median, p99)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from compiled_llm.config import check_choices, check_minimums
from compiled_llm.entrypoints.cli.args import HelpFormatter, add_dataclass_args, dataclass_from
from compiled_llm.entrypoints.cli.bench_datasets import (
    DatasetFileArgs,
    random_requests,
    read_dataset,
    sample_dataset,
)
from compiled_llm.entrypoints.cli.bench_goodput import good_requests, parse_goodput

Endpoint = Literal["/v1/completions", "/v1/chat/completions"]


@dataclass
class ServeBenchArgs(DatasetFileArgs):
    """`bench serve`: where the server is, what to send it, and where the result goes."""

    base_url: str | None = None
    """The server, e.g. http://127.0.0.1:8000 (default: http://HOST:PORT)."""
    host: str = "127.0.0.1"
    """The server's host, when --base-url is not given."""
    port: int = 8000
    """The server's port, when --base-url is not given."""
    endpoint: Endpoint = "/v1/completions"
    """The API to stream from. /v1/completions gets random prompts as token ids and a file
    dataset's as text; the chat one gets them as text (random ones decoded with --tokenizer)."""
    backend: Literal["vllm", "openai", "openai-chat"] | None = None
    """vLLM's name for the API: vllm and openai stream /v1/completions, openai-chat
    /v1/chat/completions (it sets --endpoint)."""
    model: str | None = None
    """The model name to send (default: the server's first model in /v1/models)."""
    tokenizer: str | None = None
    """Local tokenizer directory the prompt ids are drawn from and a file dataset's texts
    counted with (default: --model)."""
    dataset_name: Literal["random", "sharegpt", "custom"] = "random"
    """random: prompts of uniform random token ids. sharegpt: a ShareGPT JSON file's first
    turns (--dataset-path), each asking for its reply's token count. custom: a JSON-lines
    file's "prompt"s (--dataset-path), each asking for --custom-output-len tokens."""
    random_input_len: int = 1024
    """Prompt length in tokens."""
    random_output_len: int = 128
    """Tokens asked for each prompt (max_tokens)."""
    random_range_ratio: float = 0.0
    """Each length is drawn uniformly from [len * (1 - ratio), len * (1 + ratio)]."""
    num_prompts: int = 1000
    """Requests to send."""
    max_concurrency: int | None = None
    """At most this many requests in flight (default: no limit)."""
    request_rate: float = float("inf")
    """Requests per second, arriving as a Poisson process (inf: all at once)."""
    burstiness: float = 1.0
    """Shape of the gamma-distributed gaps between arrivals at --request-rate (mean 1/rate):
    1 is a Poisson process, lower is burstier, higher more uniform."""
    seed: int = 0
    """Seeds the dataset and the arrival times."""
    ignore_eos: bool = False
    """Ask the server to ignore EOS, so that every request generates its max_tokens."""
    temperature: float | None = None
    """Sampling temperature sent with every request (default: the server's)."""
    num_client_processes: int = 1
    """Client processes the requests and the concurrency are split over: one Python process
    reads about 6k streamed events a second."""
    ready_check_timeout_sec: int = 600
    """Wait this long for the server's /health to answer before giving up."""
    save_result: bool = False
    """Write the result as JSON (to --result-filename in --result-dir)."""
    result_dir: str | None = None
    """Folder of the JSON result (default: the current one)."""
    result_filename: str | None = None
    """File name of the JSON result (default: one made of the rate, concurrency and time);
    giving it saves the result too."""
    percentile_metrics: str = "ttft,tpot,itl"
    """Comma-separated metrics (of ttft, tpot, itl, e2el) whose percentiles are reported."""
    metric_percentiles: str = "99"
    """Comma-separated percentiles (0-100) of those metrics, as p<q>_<metric>_ms keys."""
    goodput: list[str] | None = None
    """Service level objectives as KEY:VALUE pairs in ms (keys ttft, tpot, e2el), e.g.
    ttft:500 tpot:50: request_goodput is the requests/s that meet all of them."""

    def __post_init__(self) -> None:
        check_choices(self)
        if self.backend is not None:
            self.endpoint = ("/v1/chat/completions" if self.backend == "openai-chat"
                             else "/v1/completions")
        metrics, quantiles = self.metrics(), self.percentiles()
        if not metrics or set(metrics) - set(METRICS):
            raise ValueError(f"percentile_metrics must name some of {METRICS}, got "
                             f"{self.percentile_metrics!r}")
        if not quantiles or not all(0 <= q <= 100 for q in quantiles):
            raise ValueError(f"metric_percentiles must be numbers in [0, 100], got "
                             f"{self.metric_percentiles!r}")
        check_minimums(self, {"random_input_len": 1, "random_output_len": 1, "num_prompts": 1,
                              "max_concurrency": 1, "num_client_processes": 1,
                              "random_range_ratio": 0.0, "ready_check_timeout_sec": 0})
        if not self.random_range_ratio < 1:
            raise ValueError(f"random_range_ratio must be < 1, got {self.random_range_ratio}")
        if not self.request_rate > 0:
            raise ValueError(f"request_rate must be > 0, got {self.request_rate}")
        if not self.burstiness > 0:
            raise ValueError(f"--burstiness must be > 0, got {self.burstiness}")
        self.check_dataset_file(self.dataset_name)
        self.slos()

    def metrics(self) -> list[str]:
        """The metrics whose percentiles are reported."""
        return [name.strip() for name in self.percentile_metrics.split(",") if name.strip()]

    def percentiles(self) -> list[float]:
        """The percentiles reported (ValueError naming the field for a non-number)."""
        try:
            return [float(q) for q in self.metric_percentiles.split(",") if q.strip()]
        except ValueError:
            raise ValueError(f"metric_percentiles must be numbers in [0, 100], got "
                             f"{self.metric_percentiles!r}") from None

    def slos(self) -> dict[str, float]:
        """--goodput as {metric: SLO in ms} (ValueError naming the flag for a bad pair)."""
        return parse_goodput(self.goodput or [])


METRICS = ("ttft", "tpot", "itl", "e2el")


def add_parser(kinds: argparse._SubParsersAction) -> None:
    """Register `bench serve` (a client: it takes no engine flags)."""
    parser = kinds.add_parser("serve", formatter_class=HelpFormatter,
                              help="stream a dataset to a running server, as vLLM's")
    add_dataclass_args(parser, ServeBenchArgs, title="bench serve options")
    parser.set_defaults(func=run_bench_serve)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile with linear interpolation (numpy's default)."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def request_bodies(data: list[tuple[list[int] | str, int]], model: str, chat: bool,
                   tokenizer=None, **fields) -> list[dict]:
    """Streamed request bodies (usage in the last event), with `fields` (None ones left out)
    in each: completions get the prompt as it is (ids or text); chat gets it as text (ids
    decoded), as one message."""
    common = {"model": model, "stream": True, "stream_options": {"include_usage": True},
              **{k: v for k, v in fields.items() if v is not None}}
    if not chat:
        return [{**common, "prompt": prompt, "max_tokens": n} for prompt, n in data]

    def text(prompt: list[int] | str) -> str:
        return prompt if isinstance(prompt, str) else tokenizer.decode(prompt)

    return [{**common, "messages": [{"role": "user", "content": text(prompt)}],
             "max_completion_tokens": n} for prompt, n in data]


def serve_requests(opts: ServeBenchArgs, entries: list | None,
                   tokenizer) -> list[tuple[list[int] | str, int]]:
    """(prompt, max_tokens) per request: random token ids, or the texts sampled from a file
    dataset's entries (read_dataset's; custom ones bare for the chat endpoint)."""
    if entries is None:
        return random_requests(opts.num_prompts, opts.random_input_len,
                               opts.random_output_len, opts.random_range_ratio,
                               len(tokenizer), opts.seed)
    chat = opts.endpoint == "/v1/chat/completions"
    return [(req.prompt, req.output_len) for req in sample_dataset(
        opts.dataset_name, entries, tokenizer, opts.num_prompts, opts.seed, opts,
        template=not chat)]


def summarize(records: list, duration: float, percentiles: tuple[float, ...] = (),
              slos: dict[str, float] | None = None) -> dict:
    """vLLM's result keys: counts, throughputs, request_goodput (None without slos),
    {mean,median,std,p99}_{ttft,tpot,itl,e2el}_ms and p<q> of `percentiles` over the
    successful requests, and per-request lists over all of them; `starts` (send times on the
    machine's monotonic clock, as time.monotonic() and the server's logs read it) places each
    request's gaps in time."""
    ok = [r for r in records if r.ok]
    inputs, outputs = sum(r.prompt_len for r in ok), sum(r.output_tokens for r in ok)
    result = {"duration": duration, "completed": len(ok), "failed": len(records) - len(ok),
              "total_input_tokens": inputs, "total_output_tokens": outputs,
              "request_throughput": len(ok) / duration,
              "request_goodput": good_requests(ok, slos) / duration if slos else None,
              "output_throughput": outputs / duration,
              "total_token_throughput": (inputs + outputs) / duration}
    samples = {"ttft": [r.ttft for r in ok], "itl": [x for r in ok for x in r.itl],
               "tpot": [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok
                        if r.output_tokens > 1],
               "e2el": [r.latency for r in ok]}
    for name, secs in samples.items():
        ms = [s * 1000 for s in secs]
        stats = (statistics.fmean(ms), statistics.median(ms), statistics.pstdev(ms),
                 percentile(ms, 99)) if ms else (float("nan"),) * 4
        result.update({f"{stat}_{name}_ms": value
                       for stat, value in zip(("mean", "median", "std", "p99"), stats)})
        result.update({f"p{q:g}_{name}_ms": percentile(ms, q) if ms else float("nan")
                       for q in percentiles})
    result.update(input_lens=[r.prompt_len for r in records],
                  output_lens=[r.output_tokens for r in records],
                  ttfts=[r.ttft for r in records], itls=[r.itl for r in records],
                  e2els=[r.latency for r in records], errors=[r.error for r in records],
                  starts=[r.start for r in records])
    return result


_SECTIONS = (("Time to First Token", "ttft", "TTFT"),
             ("Time per Output Token (excl. 1st token)", "tpot", "TPOT"),
             ("Inter-token Latency", "itl", "ITL"), ("End-to-end Latency", "e2el", "E2EL"))


def print_report(result: dict, max_concurrency: int | None,
                 metrics: tuple[str, ...] = ("ttft", "tpot", "itl"),
                 percentiles: tuple[float, ...] = (99,)) -> None:
    """The result as vLLM prints it: mean, median and each percentile of each metric."""
    def row(label: str, value) -> None:
        print(f"{label:<40} {value:<10.2f}" if isinstance(value, float) else
              f"{label:<40} {value:<10}")

    print(f"{' Serving Benchmark Result ':=^50}")
    row("Successful requests:", result["completed"])
    if result["failed"]:
        row("Failed requests:", result["failed"])
    if max_concurrency is not None:
        row("Maximum request concurrency:", max_concurrency)
    for label, key in (("Benchmark duration (s):", "duration"),
                       ("Total input tokens:", "total_input_tokens"),
                       ("Total generated tokens:", "total_output_tokens"),
                       ("Request throughput (req/s):", "request_throughput"),
                       ("Request goodput (req/s):", "request_goodput"),
                       ("Output token throughput (tok/s):", "output_throughput"),
                       ("Total token throughput (tok/s):", "total_token_throughput")):
        if result.get(key) is not None:
            row(label, result[key])
    for title, key, short in (section for section in _SECTIONS if section[1] in metrics):
        print(f"{title:-^50}")
        for stat in ("mean", "median", *(f"p{q:g}" for q in percentiles)):
            row(f"{stat.capitalize() if stat[0] != 'p' else stat.upper()} {short} (ms):",
                result[f"{stat}_{key}_ms"])
    print("=" * 50)


def _headers() -> dict:
    key = os.environ.get("OPENAI_API_KEY")  # as vLLM's client: the server's --api-key
    return {"Authorization": f"Bearer {key}"} if key else {}


def wait_ready(base_url: str, timeout_s: float) -> None:
    """Return once the server's /health answers 200; ValueError after timeout_s."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{base_url}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise ValueError(f"no server answered at {base_url}/health in {timeout_s} s")
        time.sleep(1)


def served_model(base_url: str) -> str:
    """The first model the server lists."""
    import httpx

    response = httpx.get(f"{base_url}/v1/models", headers=_headers(), timeout=30)
    response.raise_for_status()
    return response.json()["data"][0]["id"]


def load_tokenizer(path: str | None):
    """The tokenizer at a local directory; ValueError naming --tokenizer if it is not one."""
    from transformers import AutoTokenizer

    if not path or not Path(path).is_dir():
        raise ValueError(f"the prompts are drawn from a local tokenizer: {path!r} is not a "
                         "directory (pass --tokenizer)")
    return AutoTokenizer.from_pretrained(path)


def run_load(base_url: str, endpoint: str, bodies: list[dict], processes: int = 1,
             concurrency: int | None = None, rate: float = float("inf"),
             seed: int = 0, percentiles: tuple[float, ...] = (), burstiness: float = 1.0,
             slos: dict[str, float] | None = None) -> dict:
    """Stream every body to base_url + endpoint from `processes` client processes (at most
    `concurrency` in flight, gamma arrivals of shape `burstiness` at `rate`); summarize() of
    the records."""
    from compiled_llm.entrypoints.cli import serve_client

    shares = serve_client.split(bodies, processes, concurrency, rate, seed,
                                url=base_url + endpoint, headers=_headers(),
                                chat=endpoint == "/v1/chat/completions", burstiness=burstiness)
    return summarize(*serve_client.run_clients(shares), percentiles, slos)


def run_bench_serve(ns: argparse.Namespace) -> int:
    """Send one request untimed (as vLLM's test run: a bad setup fails fast), then time
    the whole dataset; print the report and save it as JSON if asked."""
    opts = dataclass_from(ServeBenchArgs, ns)
    entries = read_dataset(opts.dataset_name, opts)  # a bad file fails before the wait
    base_url = (opts.base_url or f"http://{opts.host}:{opts.port}").rstrip("/")
    wait_ready(base_url, opts.ready_check_timeout_sec)
    model = opts.model or served_model(base_url)
    tokenizer = load_tokenizer(opts.tokenizer or model)
    bodies = request_bodies(serve_requests(opts, entries, tokenizer), model,
                            opts.endpoint == "/v1/chat/completions", tokenizer,
                            temperature=opts.temperature, ignore_eos=opts.ignore_eos or None)
    test = run_load(base_url, opts.endpoint, bodies[:1])
    if not test["completed"]:
        raise ValueError(f"the test request failed: {test['errors'][0]}")
    print(f"Traffic request rate: {opts.request_rate}, maximum concurrency: "
          f"{opts.max_concurrency}, {opts.num_client_processes} client process(es)")
    print(f"Burstiness factor: {opts.burstiness} "
          f"({'Poisson process' if opts.burstiness == 1 else 'Gamma distribution'})")
    percentiles = tuple(opts.percentiles())
    result = run_load(base_url, opts.endpoint, bodies, opts.num_client_processes,
                      opts.max_concurrency, opts.request_rate, opts.seed, percentiles,
                      opts.burstiness, opts.slos())
    print_report(result, opts.max_concurrency, tuple(opts.metrics()), percentiles)
    if opts.save_result or opts.result_filename:
        save_result(opts, model, result)
    return 0


def save_result(opts: ServeBenchArgs, model: str, result: dict) -> Path:
    """Write the run's settings and result as one JSON object; its path."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = opts.result_filename or (f"compiled-llm-{opts.request_rate}qps-concurrency"
                                    f"{opts.max_concurrency}-{stamp}.json")
    path = Path(opts.result_dir or ".") / name
    path.parent.mkdir(parents=True, exist_ok=True)
    config = {"date": stamp, "endpoint_type": "openai", **asdict(opts),
              "backend": opts.backend or "openai",
              "model_id": model}
    if config["request_rate"] == float("inf"):  # JSON has no infinity: vLLM writes "inf"
        config["request_rate"] = "inf"
    path.write_text(json.dumps({**config, **result}, indent=2) + "\n")
    print(f"result: {path}")
    return path
