"""`compiled-llm bench latency|throughput`, as vLLM's `vllm bench`: random token-id prompts
through the public LLM API, on an engine built from the flags every subcommand takes."""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from compiled_llm.entrypoints.cli.args import (
    HelpFormatter,
    add_dataclass_args,
    add_engine_args,
    dataclass_from,
    engine_args,
)


def _check_at_least(config: object, minimums: dict[str, int]) -> None:
    for name, low in minimums.items():
        if getattr(config, name) < low:
            raise ValueError(f"{name} must be >= {low}, got {getattr(config, name)}")


@dataclass
class LatencyArgs:
    """`bench latency`: seconds for one batch, from its prompts to its last tokens."""

    batch_size: int = 8
    """Prompts in each batch."""
    input_len: int = 32
    """Prompt length in tokens."""
    output_len: int = 128
    """Tokens generated for each prompt (EOS is ignored)."""
    num_iters_warmup: int = 10
    """Batches run before timing starts."""
    num_iters: int = 30
    """Batches timed. Every batch repeats the same prompts, so after the first one prefix
    caching serves their prefill (--no-enable-prefix-caching times it too)."""
    output_json: str | None = None
    """Also write the latencies to this JSON file."""

    def __post_init__(self) -> None:
        _check_at_least(self, {"batch_size": 1, "input_len": 1, "output_len": 1,
                               "num_iters_warmup": 0, "num_iters": 1})


@dataclass
class ThroughputArgs:
    """`bench throughput`: every prompt submitted at once, timed until the last finishes."""

    num_prompts: int = 1000
    """Prompts to generate for."""
    input_len: int = 128
    """Prompt length in tokens."""
    output_len: int = 128
    """Tokens generated for each prompt (EOS is ignored)."""
    output_json: str | None = None
    """Also write the figures to this JSON file."""

    def __post_init__(self) -> None:
        _check_at_least(self, {"num_prompts": 1, "input_len": 1, "output_len": 1})


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `bench latency` and `bench throughput`: the engine flags plus their own."""
    bench = subparsers.add_parser("bench", help="benchmark latency or throughput")
    kinds = bench.add_subparsers(dest="bench_command", required=True,
                                 metavar="{latency,throughput}")
    for name, cls, func, about in (
            ("latency", LatencyArgs, run_latency, "seconds per batch: average and percentiles"),
            ("throughput", ThroughputArgs, run_throughput, "requests/s and tokens/s")):
        parser = kinds.add_parser(name, formatter_class=HelpFormatter, help=about)
        add_engine_args(parser)
        add_dataclass_args(parser, cls, title=f"bench {name} options")
        parser.set_defaults(func=func)


def _setup(ns: argparse.Namespace, count: int, input_len: int, output_len: int):
    """(LLM, prompts, params): `count` random prompts of input_len token ids."""
    from compiled_llm import LLM, SamplingParams

    args = engine_args(ns)
    llm = LLM(**dataclasses.asdict(args))
    if llm.get_tokenizer() is None:
        raise ValueError("skip_tokenizer_init: bench draws prompt ids from the tokenizer")
    vocab, rng = len(llm.get_tokenizer()), random.Random(args.seed)
    prompts = [{"prompt_token_ids": [rng.randrange(vocab) for _ in range(input_len)]}
               for _ in range(count)]
    params = SamplingParams(temperature=1.0, top_p=1.0, ignore_eos=True, max_tokens=output_len)
    return llm, prompts, params


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile with linear interpolation (numpy's default)."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _timed_generate(llm, prompts, params) -> tuple[float, list]:
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start, outputs


def _write_json(path: str | None, result: dict) -> None:
    if path:
        Path(path).write_text(json.dumps(result, indent=4) + "\n")


def run_latency(ns: argparse.Namespace) -> int:
    """Warm up, time num_iters batches, print the average and percentiles in seconds."""
    opts = dataclass_from(LatencyArgs, ns)
    llm, prompts, params = _setup(ns, opts.batch_size, opts.input_len, opts.output_len)
    for _ in range(opts.num_iters_warmup):
        llm.generate(prompts, params, use_tqdm=False)
    latencies = [_timed_generate(llm, prompts, params)[0] for _ in range(opts.num_iters)]
    result = {"avg_latency": statistics.fmean(latencies), "latencies": latencies,
              "percentiles": {str(q): percentile(latencies, q) for q in (50, 90)}}
    print(f"Avg latency: {result['avg_latency']:.4f} seconds")
    for q, secs in result["percentiles"].items():
        print(f"{q}% percentile latency: {secs:.4f} seconds")
    _write_json(opts.output_json, result)
    return 0


def run_throughput(ns: argparse.Namespace) -> int:
    """Generate for num_prompts prompts at once; print requests/s and tokens/s."""
    opts = dataclass_from(ThroughputArgs, ns)
    llm, prompts, params = _setup(ns, opts.num_prompts, opts.input_len, opts.output_len)
    # one untimed request first: the first step pays one-off costs (a prompt of zeros shares
    # no prefix with the random ones)
    llm.generate({"prompt_token_ids": [0] * opts.input_len}, params, use_tqdm=False)
    elapsed, outputs = _timed_generate(llm, prompts, params)
    output_tokens = sum(len(out.outputs[0].token_ids) for out in outputs)
    total_tokens = output_tokens + opts.num_prompts * opts.input_len
    result = {"elapsed_time": elapsed, "num_requests": opts.num_prompts,
              "total_num_tokens": total_tokens, "total_output_tokens": output_tokens,
              "requests_per_second": opts.num_prompts / elapsed,
              "tokens_per_second": total_tokens / elapsed,
              "output_tokens_per_second": output_tokens / elapsed}
    print(f"Throughput: {result['requests_per_second']:.2f} requests/s, "
          f"{result['tokens_per_second']:.2f} total tokens/s, "
          f"{result['output_tokens_per_second']:.2f} output tokens/s")
    _write_json(opts.output_json, result)
    return 0
