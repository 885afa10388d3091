"""Compile-time and speed figures for the compiler backend (issue: compiler backend).

Each phase runs in a fresh process so cold and warm starts are honest:
  cold/warm start of the backend (stage by stage) and of stock torch.compile;
  decode and prefill speed with eager, stock, backend without passes, backend, backend + CUDA
  graphs; recompiles after capturing every batch size.

    python -m benchmarks.compile_bench --shape llama3-8b --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks.common import print_table, random_checkpoint, save_json

MODES = {
    "eager": dict(enforce_eager=True),
    "stock": dict(compile_mode="stock", cudagraph_mode="none"),
    "backend-nopasses": dict(compile_mode="backend", cudagraph_mode="none",
                             passes={"enabled": False}),
    "backend": dict(compile_mode="backend", cudagraph_mode="none"),
    "backend+cudagraphs": dict(compile_mode="backend", cudagraph_mode="full_and_piecewise"),
}


TABLE = ["phase", "mode", "startup s", "load s", "dynamo s", "inductor s", "cache_load s",
         "compile_and_profile s", "cudagraphs s", "unique pieces", "cache hits", "recompiles",
         "decode tok/s (b=1)", "prefill tok/s (1k)", "recompiles after run"]


def phase(args) -> dict:
    """One measurement in this process; returns a result row."""
    import torch

    from compiled_llm import LLM, SamplingParams
    from compiled_llm.compile import counters, graph_break_count

    kw = dict(MODES[args.mode])
    if kw.get("passes", {}).get("enabled") is False:
        kw["passes"] = {k: False for k in _pass_flags()}
    t0 = time.perf_counter()
    llm = LLM(args.model, dtype="bfloat16", max_model_len=args.max_model_len, seed=0,
              max_num_seqs=args.max_num_seqs, compile_cache_dir=args.cache_dir,
              skip_tokenizer_init=True, enable_prefix_caching=False, **kw)
    startup = time.perf_counter() - t0
    row = {"phase": args.label, "mode": args.mode, "startup s": startup,
           **{f"{k} s": v for k, v in llm.engine.startup_seconds.items()},
           **{f"{k} s": v for k, v in counters.stage_seconds.items()},
           "unique pieces": counters.unique_pieces, "cache hits": counters.cache_hits,
           "recompiles": counters.recompiles, "graph breaks": graph_break_count(),
           **{f"capture {k} s": v for k, v in llm.engine.cudagraph_capture_seconds.items()}}
    if args.speed:
        row.update(_speed(llm, SamplingParams, torch))
        row["recompiles after run"] = counters.recompiles
    if args.profile_dir:
        _profile(llm, SamplingParams, torch, f"{args.profile_dir}/profile_{args.mode}.txt")
    return row


def _profile(llm, SamplingParams, torch, path: str) -> None:
    """Kernel table (device time, calls) of one 1k-token prefill and of 32 decode steps."""
    from torch.profiler import ProfilerActivity, profile

    vocab = llm.engine.model_config.vocab_size
    long = {"prompt_token_ids": [(i * 7) % (vocab - 10) + 10 for i in range(1024)]}
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with open(path, "w") as f:
        for name, n in (("prefill 1k", 1), ("prefill 1k + 32 decode steps", 33)):
            params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
            llm.generate(long, params, use_tqdm=False)
            with profile(activities=acts) as prof:
                llm.generate(long, params, use_tqdm=False)
            table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=30)
            f.write(f"## {name}\n\n{table}\n\n")


def _pass_flags() -> list[str]:
    import dataclasses

    from compiled_llm.passes import PassConfig

    return [f.name for f in dataclasses.fields(PassConfig) if f.name.startswith("enable_")]


def _speed(llm, SamplingParams, torch) -> dict:
    prompt = {"prompt_token_ids": list(range(1000, 1128))}
    gen = lambda n, p=prompt: llm.generate(  # noqa: E731
        p, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True), use_tqdm=False)
    gen(8)
    timings = {}
    for n in (1, 257):
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        t = time.perf_counter()
        gen(n)
        timings[n] = time.perf_counter() - t
    vocab = llm.engine.model_config.vocab_size
    long = {"prompt_token_ids": [(i * 7) % (vocab - 10) + 10 for i in range(1024)]}
    gen(1, long)
    t = time.perf_counter()
    gen(1, long)
    prefill = time.perf_counter() - t
    return {"decode tok/s (b=1)": 256 / (timings[257] - timings[1]),
            "prefill tok/s (1k)": 1024 / prefill}


def run_phase(args, mode: str, label: str, env: dict, speed: bool) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.compile_bench", "--phase", "--mode", mode,
           "--label", label, "--model", args.model, "--cache-dir", env["CACHE"],
           "--max-model-len", str(args.max_model_len), "--max-num-seqs", str(args.max_num_seqs)]
    cmd += ["--speed"] if speed else []
    cmd += ["--profile-dir", args.profile_dir] if speed and args.profile_dir else []
    penv = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": env["INDUCTOR"]}
    out = subprocess.run(cmd, env=penv, capture_output=True, text=True)
    if out.returncode != 0:
        print(out.stderr[-4000:], file=sys.stderr)
        row = {"phase": label, "mode": mode, "error": out.stderr.strip().splitlines()[-1]}
    else:
        row = json.loads(out.stdout.strip().splitlines()[-1])
    print(json.dumps(row), flush=True)  # each row as it lands, in case a later phase hangs
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="cpu-small")
    ap.add_argument("--model", default=None)
    ap.add_argument("--mode", default="backend")
    ap.add_argument("--label", default="")
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--phase", action="store_true", help="internal: run one phase and exit")
    ap.add_argument("--speed", action="store_true")
    ap.add_argument("--phases", nargs="+", default=["startup", "speed"])
    ap.add_argument("--speed-modes", nargs="+", default=list(MODES))
    ap.add_argument("--checkpoint-dir", default=None, help="reuse or create the checkpoint here")
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile-dir", default=None,
                    help="speed phases also write a kernel table per mode here")
    args = ap.parse_args()
    if args.phase:
        print(json.dumps(phase(args)))
        return
    args.model = args.model or str(random_checkpoint(args.shape, out=args.checkpoint_dir))
    rows = []
    for mode in ("backend", "stock") if "startup" in args.phases else ():
        env = {"CACHE": tempfile.mkdtemp(), "INDUCTOR": tempfile.mkdtemp()}
        rows.append(run_phase(args, mode, "cold", env, speed=False))
        rows.append(run_phase(args, mode, "warm", env, speed=False))
    env = {"CACHE": tempfile.mkdtemp(), "INDUCTOR": tempfile.mkdtemp()}
    for mode in args.speed_modes if "speed" in args.phases else ():
        rows.append(run_phase(args, mode, "speed", env, speed=True))
    table = [{k: r.get(k, "") for k in TABLE} for r in rows]
    print_table(table, f"Compile and speed, {args.shape}")
    for r in rows:
        if "error" in r:
            print(f"{r['phase']} {r['mode']}: {r['error']}")
    save_json(args.json, {"shape": args.shape, "rows": rows})


if __name__ == "__main__":
    main()
