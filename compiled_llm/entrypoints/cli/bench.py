"""`compiled-llm bench latency|throughput|serve`, as vLLM's `vllm bench`: latency and throughput
time the user's path (LLM.generate, detokenizing, on the engine the shared flags build, their
defaults EngineArgs'; throughput on random, nano-vllm, ShareGPT or custom prompts); serve
(bench_serve.py) streams to a running server."""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from compiled_llm.config import check_choices, check_minimums
from compiled_llm.entrypoints.cli import bench_serve
from compiled_llm.entrypoints.cli.args import (
    HelpFormatter,
    add_dataclass_args,
    add_engine_args,
    dataclass_from,
    engine_args,
)
from compiled_llm.entrypoints.cli.bench_datasets import (
    DatasetFileArgs,
    read_dataset,
    sample_dataset,
)
from compiled_llm.entrypoints.cli.bench_serve import percentile


@dataclass
class LatencyArgs:
    """`bench latency`: seconds for one batch, from its prompts to its last tokens."""

    batch_size: int = 8
    """Prompts in each batch."""
    input_len: int = 32
    """Prompt length in tokens."""
    output_len: int = 128
    """Tokens generated for each prompt (EOS is ignored)."""
    n: int = 1
    """Sequences generated for each prompt (SamplingParams.n)."""
    num_iters_warmup: int = 10
    """Batches run before timing starts."""
    num_iters: int = 30
    """Batches timed. Every batch repeats the same prompts, so after the first one prefix
    caching serves their prefill (--no-enable-prefix-caching times it too)."""
    output_json: str | None = None
    """Also write the latencies to this JSON file."""

    def __post_init__(self) -> None:
        check_minimums(self, {"batch_size": 1, "input_len": 1, "output_len": 1, "n": 1,
                               "num_iters_warmup": 0, "num_iters": 1})


@dataclass
class ThroughputArgs(DatasetFileArgs):
    """`bench throughput`: every prompt submitted at once, timed until the last finishes."""

    dataset_name: Literal["random", "nano-vllm", "sharegpt", "custom"] = "random"
    """random: --num-prompts prompts of --input-len random token ids, --output-len tokens
    each, temperature 1.0 (vLLM's bench throughput). nano-vllm: nano-vllm's bench workload,
    256 prompts, prompt and output lengths each uniform in [100, 1024], temperature 0.6
    (--input-len and --output-len do not apply). sharegpt, custom: the texts of
    --dataset-path, sampled as `bench serve` samples them, temperature 1.0."""
    num_prompts: int | None = None
    """Prompts to generate for (default: 1000; 256 nano-vllm)."""
    input_len: int = 128
    """Prompt length in tokens (random)."""
    output_len: int | None = None
    """Tokens generated for each prompt (default: 128 random; sharegpt's replies' counts or
    --sharegpt-output-len, --custom-output-len: given, it overrides them, as vLLM's); EOS is
    ignored in every dataset."""
    temperature: float | None = None
    """Sampling temperature (default: the dataset's, 1.0 random, 0.6 nano-vllm)."""
    n: int = 1
    """Sequences generated for each prompt (SamplingParams.n; each one's tokens count)."""
    output_json: str | None = None
    """Also write the figures to this JSON file."""

    def __post_init__(self) -> None:
        check_choices(self)
        check_minimums(self, {"num_prompts": 1, "input_len": 1, "output_len": 1,
                              "temperature": 0.0, "n": 1})
        self.check_dataset_file(self.dataset_name)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `bench latency` and `bench throughput` (the engine flags plus their own) and
    `bench serve`."""
    bench = subparsers.add_parser("bench", help="benchmark latency, throughput or a server")
    kinds = bench.add_subparsers(dest="bench_command", required=True,
                                 metavar="{latency,throughput,serve}")
    for name, cls, func, about in (
            ("latency", LatencyArgs, run_latency, "seconds per batch: average and percentiles"),
            ("throughput", ThroughputArgs, run_throughput, "requests/s and tokens/s")):
        parser = kinds.add_parser(name, formatter_class=HelpFormatter, help=about)
        add_engine_args(parser)
        add_dataclass_args(parser, cls, title=f"bench {name} options")
        parser.set_defaults(func=func)
    bench_serve.add_parser(kinds)


def _engine(ns: argparse.Namespace):
    """The LLM the engine flags describe; it must have a tokenizer (the prompt ids are drawn
    from its vocabulary and the outputs detokenized, as a user's are)."""
    from compiled_llm import LLM

    llm = LLM(**dataclasses.asdict(engine_args(ns)))
    if llm.get_tokenizer() is None:
        raise ValueError("skip_tokenizer_init: bench draws prompt ids from the tokenizer")
    return llm


def _random_prompts(llm, seed: int, count: int, input_len: int) -> list[dict]:
    vocab, rng = len(llm.get_tokenizer()), random.Random(seed)
    return [{"prompt_token_ids": [rng.randrange(vocab) for _ in range(input_len)]}
            for _ in range(count)]


def nano_vllm_requests(vocab: int, count: int = 256, seed: int = 0):
    """(prompt token ids, output length) per request, as nano-vllm's bench makes them."""
    rng = random.Random(seed)
    return [([rng.randrange(vocab) for _ in range(rng.randint(100, 1024))],
             rng.randint(100, 1024)) for _ in range(count)]


def nano_vllm_workload(llm, count: int = 256, temperature: float = 0.6, seed: int = 0,
                       n: int = 1):
    """(prompts, one SamplingParams per prompt) of the nano-vllm workload: ignore_eos, each
    request its own output length (n sequences each)."""
    from compiled_llm import SamplingParams

    reqs = nano_vllm_requests(llm.get_tokenizer().vocab_size, count, seed)
    return ([{"prompt_token_ids": ids} for ids, _ in reqs],
            [SamplingParams(n=n, temperature=temperature, ignore_eos=True, max_tokens=length)
             for _, length in reqs])


def _setup(ns: argparse.Namespace, count: int, input_len: int, output_len: int,
           temperature: float = 1.0, n: int = 1):
    """(LLM, prompts, params): `count` random prompts of input_len token ids, n sequences
    each."""
    from compiled_llm import SamplingParams

    llm = _engine(ns)
    params = SamplingParams(n=n, temperature=temperature, top_p=1.0, ignore_eos=True,
                            max_tokens=output_len)
    return llm, _random_prompts(llm, ns.seed, count, input_len), params


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
    llm, prompts, params = _setup(ns, opts.batch_size, opts.input_len, opts.output_len,
                                  n=opts.n)
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


def file_workload(llm, opts: ThroughputArgs, entries: list, seed: int = 0,
                  temperature: float = 1.0):
    """(text prompts, one SamplingParams per prompt) sampled from a file dataset's entries
    (read_dataset's) with the LLM's tokenizer: each its own output length, EOS ignored."""
    from compiled_llm import SamplingParams

    reqs = sample_dataset(opts.dataset_name, entries, llm.get_tokenizer(),
                          opts.num_prompts or 1000, seed, opts, output_len=opts.output_len)
    return ([req.prompt for req in reqs],
            [SamplingParams(n=opts.n, temperature=temperature, top_p=1.0, ignore_eos=True,
                            max_tokens=req.output_len) for req in reqs])


def _throughput_workload(ns: argparse.Namespace, opts: ThroughputArgs, entries: list | None):
    """(LLM, prompts, params) of the chosen dataset (entries: a file dataset's)."""
    if opts.dataset_name == "nano-vllm":
        llm = _engine(ns)
        temperature = 0.6 if opts.temperature is None else opts.temperature
        return (llm, *nano_vllm_workload(llm, opts.num_prompts or 256, temperature, ns.seed,
                                         opts.n))
    temperature = 1.0 if opts.temperature is None else opts.temperature
    if entries is not None:
        llm = _engine(ns)
        return (llm, *file_workload(llm, opts, entries, ns.seed, temperature))
    return _setup(ns, opts.num_prompts or 1000, opts.input_len, opts.output_len or 128,
                  temperature, opts.n)


def run_throughput(ns: argparse.Namespace) -> int:
    """Generate for every prompt at once; print requests/s and tokens/s."""
    from compiled_llm import SamplingParams

    opts = dataclass_from(ThroughputArgs, ns)
    entries = read_dataset(opts.dataset_name, opts)  # a bad file fails before the engine
    llm, prompts, params = _throughput_workload(ns, opts, entries)
    # one untimed request first: the first step pays one-off costs (a prompt of zeros shares
    # no prefix with the random ones)
    llm.generate({"prompt_token_ids": [0] * 16}, SamplingParams(max_tokens=4, ignore_eos=True),
                 use_tqdm=False)
    elapsed, outputs = _timed_generate(llm, prompts, params)
    output_tokens = sum(len(seq.token_ids) for out in outputs for seq in out.outputs)
    prompt_tokens = sum(len(out.prompt_token_ids) for out in outputs)
    total_tokens = output_tokens + prompt_tokens
    result = {"dataset_name": opts.dataset_name, "elapsed_time": elapsed,
              "num_requests": len(prompts), "total_num_tokens": total_tokens,
              "total_output_tokens": output_tokens,
              "requests_per_second": len(prompts) / elapsed,
              "tokens_per_second": total_tokens / elapsed,
              "output_tokens_per_second": output_tokens / elapsed}
    print(f"Throughput: {result['requests_per_second']:.2f} requests/s, "
          f"{result['tokens_per_second']:.2f} total tokens/s, "
          f"{result['output_tokens_per_second']:.2f} output tokens/s")
    _write_json(opts.output_json, result)
    return 0
