"""Where a workload's device time goes: the user's path (`LLM(model=DIR)` defaults, the core
in-process so the profiler sees it) under torch.profiler, kernels grouped by kind.

    python -m benchmarks.profile_steps --model /tmp/ckpt/qwen3-0.6b --workload nano-vllm
    python -m benchmarks.profile_steps --model /tmp/ckpt/llama3-8b --workload decode

nano-vllm runs twice with different prompts (seed 0 timed, seed 1 profiled), so the prefix
cache cannot turn the profiled run's prefills into hits. serve-like: the serving benchmark's
requests offline (1,024 x 512 random prompt tokens, 256 out). decode: 64 greedy batch-1 steps.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch

KINDS = [  # (kind, substrings of the kernel name), first match wins
    ("attention decode", ("_decode_split", "_decode_qk_split", "_decode_reduce")),
    ("attention prefill", ("_prefill", "_varlen", "flash")),
    ("kv write", ("cache_write", "_write_kv", "reshape_and_cache", "qk_norm_rope")),
    ("gemm", ("gemm", "gemv", "cutlass", "sm90_xmma", "nvjet", "_mm_", "splitk", "matmul")),
    ("sampling", ("sample", "argmax", "gumbel", "exponential", "softmax", "topk", "sort",
                  "cumsum", "multinomial", "scatter_gather", "distribution")),
    ("copies", ("memcpy", "Memcpy", "memset", "Memset", "copy_", "index_put", "gather")),
    ("inductor fused", ("triton_",)),
]


def kind_of(name: str) -> str:
    """The KINDS entry whose substrings appear in a kernel's name ("other" if none)."""
    low = name.lower()
    for kind, keys in KINDS:
        if any(key.lower() in low for key in keys):
            return kind
    return "other"


def kernel_table(prof, steps: int, top: int = 40) -> dict:
    """Device time per kernel and per kind (ms in all and per step) from a finished profile."""
    per_kernel: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            slot = per_kernel[evt.name]
            slot[0] += evt.device_time_total / 1e3 if hasattr(evt, "device_time_total") \
                else evt.cuda_time_total / 1e3
            slot[1] += 1
    kinds: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for name, (ms, count) in per_kernel.items():
        kinds[kind_of(name)][0] += ms
        kinds[kind_of(name)][1] += count
    total = sum(ms for ms, _ in per_kernel.values())
    rows = sorted(per_kernel.items(), key=lambda item: -item[1][0])[:top]
    return {"device_ms": total, "steps": steps, "device_ms_per_step": total / max(steps, 1),
            "kernels_per_step": sum(c for _, c in per_kernel.values()) / max(steps, 1),
            "kinds": {k: {"ms": v[0], "pct": 100 * v[0] / max(total, 1e-9), "count": v[1]}
                      for k, v in sorted(kinds.items(), key=lambda kv: -kv[1][0])},
            "top": [{"name": n[:120], "ms": v[0], "count": v[1], "kind": kind_of(n)}
                    for n, v in rows]}


def kernel_spans(prof) -> list[tuple[float, float, str]]:
    """(start us, end us, name) of each device kernel or copy, by start time."""
    spans = [(evt.time_range.start, evt.time_range.end, evt.name) for evt in prof.events()
             if evt.device_type == torch.autograd.DeviceType.CUDA]
    return sorted(spans)


def timeline(spans: list[tuple[float, float, str]], steps: int, top: int = 15) -> dict:
    """The device's wall per step split into busy and idle time, the idle gaps by size, and
    the (kernel before, kernel after) pairs holding the most idle time: what a step waits on."""
    if not spans:
        return {}
    busy = idle = 0.0
    last_end, last_name = spans[0][0], "<start>"
    buckets = dict.fromkeys(("<1us", "1-2us", "2-5us", "5-20us", ">20us"), 0.0)
    pairs: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for start, end, name in spans:
        gap = start - last_end
        if gap > 0:
            idle += gap
            label = ("<1us" if gap < 1 else "1-2us" if gap < 2 else "2-5us" if gap < 5
                     else "5-20us" if gap < 20 else ">20us")
            buckets[label] += gap
            slot = pairs[(last_name[:60], name[:60])]
            slot[0] += gap
            slot[1] += 1
        busy += max(0.0, end - max(start, last_end))
        if end > last_end:
            last_end, last_name = end, name
    per_step = max(steps, 1) * 1e3
    worst = sorted(pairs.items(), key=lambda item: -item[1][0])[:top]
    return {"span_ms_per_step": (last_end - spans[0][0]) / per_step,
            "busy_ms_per_step": busy / per_step, "idle_ms_per_step": idle / per_step,
            "idle_ms_per_step_by_gap": {k: v / per_step for k, v in buckets.items()},
            "idle_pairs": [{"before": b, "after": a, "us_per_step": v[0] / max(steps, 1),
                            "count": v[1]} for (b, a), v in worst]}


def nano_vllm(llm, seed: int) -> tuple[int, float]:
    """(output tokens, seconds) of one nano-vllm run with the prompts of `seed`."""
    from compiled_llm.entrypoints.cli.bench import nano_vllm_workload

    prompts, params = nano_vllm_workload(llm, seed=seed)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return sum(len(o.outputs[0].token_ids) for o in outs), time.perf_counter() - start


def serve_like(llm, seed: int) -> tuple[int, float]:
    """(output tokens, seconds) of the serving benchmark's workload offline: 1,024 requests of
    512 random prompt tokens and 256 output tokens, temperature 1.0, ignore_eos."""
    import random

    from compiled_llm import SamplingParams

    rng = random.Random(seed)
    vocab = llm.engine.model_config.vocab_size
    prompts = [{"prompt_token_ids": [rng.randrange(1, vocab) for _ in range(512)]}
               for _ in range(1024)]
    params = SamplingParams(temperature=1.0, max_tokens=256, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    return sum(len(o.outputs[0].token_ids) for o in outs), time.perf_counter() - start


def decode(llm, new_tokens: int) -> tuple[int, float]:
    """(tokens, seconds) of one greedy batch-1 run from a 128-token prompt."""
    from compiled_llm import SamplingParams

    prompt = {"prompt_token_ids": [(7 * i) % 1000 + 1 for i in range(128)]}
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    start = time.perf_counter()
    llm.generate([prompt], params, use_tqdm=False)
    return new_tokens, time.perf_counter() - start


def run(args) -> dict:
    """Time the workload, then profile it once more; the step stats of both runs."""
    from compiled_llm import LLM

    llm = LLM(model=args.model, engine_core_process=False, **args.engine_args)
    work = {"nano-vllm": lambda seed: nano_vllm(llm, seed),
            "serve-like": lambda seed: serve_like(llm, seed),
            "decode": lambda seed: decode(llm, args.decode_tokens)}[args.workload]
    work(2)  # warm-up: Triton/Inductor autotune and the sampler's first shapes
    stats0 = llm.engine.step_stats
    tokens, seconds = work(0)
    row = {"model": args.model, "workload": args.workload, "engine_args": args.engine_args,
           "tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds}
    window = llm.engine.step_stats - stats0
    row["step_stats"] = window.per_step_ms() | {"steps": window.steps}
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        steps0 = llm.engine.step_stats.steps
        work(1)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    steps = llm.engine.step_stats.steps - steps0
    row["profile"] = kernel_table(prof, steps)
    row["timeline"] = timeline(kernel_spans(prof), steps)
    if args.trace:
        prof.export_chrome_trace(args.trace)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--workload", choices=["nano-vllm", "serve-like", "decode"],
                    default="nano-vllm")
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--engine-args", type=json.loads, default={})
    ap.add_argument("--json", default=None)
    ap.add_argument("--trace", default=None, help="also write a Chrome trace here")
    args = ap.parse_args()
    row = run(args)
    prof, line = row.pop("profile"), row.pop("timeline")
    print(json.dumps(row))
    print(json.dumps(line, indent=1))
    print(f"device ms/step {prof['device_ms_per_step']:.3f}, "
          f"kernels/step {prof['kernels_per_step']:.1f}")
    for kind, v in prof["kinds"].items():
        print(f"  {kind:20s} {v['ms']:10.1f} ms {v['pct']:5.1f}% {v['count']:8d}")
    for item in prof["top"]:
        mean_us = 1e3 * item["ms"] / item["count"]
        print(f"  {item['ms']:10.2f} ms {item['count']:7d} {mean_us:7.2f} us  [{item['kind']}] "
              f"{item['name']}")
    if args.json:
        with open(args.json, "a") as out:
            out.write(json.dumps(row | {"profile": prof, "timeline": line}) + "\n")


if __name__ == "__main__":
    main()
