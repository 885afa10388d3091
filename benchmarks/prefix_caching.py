"""Prefix caching: N requests sharing a long system prompt (plus a short unique suffix), with
automatic prefix caching on and off in the same run. Reports TTFT (mean, p50) and throughput,
with the on/off ratio.

    python -m benchmarks.prefix_caching                      # CPU: cpu-small, eager, float32
    python -m benchmarks.prefix_caching --shape qwen3-0.6b --dtype bfloat16 --mode stock  # CUDA

All requests are submitted at once, so TTFT includes queueing behind the other prefills.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

from benchmarks.common import print_table, random_checkpoint, save_json


def workload(n: int, vocab: int, prefix_len: int, suffix_len: int, seed: int = 0):
    rng = random.Random(seed)
    system = [rng.randrange(1, vocab) for _ in range(prefix_len)]
    return [system + [rng.randrange(1, vocab) for _ in range(suffix_len)] for _ in range(n)]


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run(model_dir, prompts, output_len: int, caching: bool, args) -> dict:
    """One engine, all requests submitted together; per-request time to first token."""
    from compiled_llm import LLM, SamplingParams

    kw = {"enforce_eager": True} if args.mode == "eager" else {"compile_mode": args.mode}
    llm = LLM(str(model_dir), dtype=args.dtype, skip_tokenizer_init=True,
              enable_prefix_caching=caching, max_model_len=args.max_model_len, **kw)
    eng = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    warm = [[(t + 1) % 1000 + 1 for t in p] for p in prompts[:2]]  # other tokens: no hits
    llm.generate([{"prompt_token_ids": p} for p in warm], params, use_tqdm=False)
    eng.reset_prefix_cache()
    eng.kv.stats.__init__()
    sync()
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        eng.add_request(str(i), {"prompt_token_ids": p}, params)
    first: dict[str, float] = {}
    out_tokens = 0
    while eng.has_unfinished_requests():
        outs = eng.step()
        sync()
        now = time.perf_counter()
        for o in outs:
            first.setdefault(o.request_id, now - t0)
            if o.finished:
                out_tokens += len(o.outputs[0].token_ids)
    secs = time.perf_counter() - t0
    assert out_tokens == len(prompts) * output_len and eng.num_used_blocks == 0
    ttft = sorted(first.values())
    s = eng.prefix_cache_stats
    return {"prefix caching": "on" if caching else "off",
            "TTFT mean ms": 1e3 * statistics.fmean(ttft),
            "TTFT p50 ms": 1e3 * statistics.median(ttft),
            "output tok/s": out_tokens / secs,
            "total tok/s": (out_tokens + sum(map(len, prompts))) / secs,
            "wall s": secs,
            "token hit rate": f"{100 * s.token_hit_rate:.1f}%"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="cpu-small")
    ap.add_argument("--model", default=None)
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--prefix-len", type=int, default=1024)
    ap.add_argument("--suffix-len", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--mode", default="eager", choices=["eager", "stock", "backend"])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    model_dir = args.model or random_checkpoint(args.shape, getattr(torch, args.dtype))
    vocab = json.loads(Path(model_dir, "config.json").read_text())["vocab_size"]
    prompts = workload(args.num_requests, vocab, args.prefix_len, args.suffix_len)
    off = run(model_dir, prompts, args.output_len, False, args)
    on = run(model_dir, prompts, args.output_len, True, args)
    ratio = {"prefix caching": "on / off (speedup)",
             "TTFT mean ms": off["TTFT mean ms"] / on["TTFT mean ms"],
             "TTFT p50 ms": off["TTFT p50 ms"] / on["TTFT p50 ms"],
             "output tok/s": on["output tok/s"] / off["output tok/s"],
             "total tok/s": on["total tok/s"] / off["total tok/s"],
             "wall s": off["wall s"] / on["wall s"], "token hit rate": ""}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print_table([off, on, ratio],
                f"Prefix caching: {args.num_requests} requests, {args.prefix_len}-token shared "
                f"prefix + {args.suffix_len} unique, {args.output_len} out, {args.shape} "
                f"({args.mode}, {args.dtype}, {device})")
    save_json(args.json, {"args": vars(args), "rows": [off, on, ratio]})


if __name__ == "__main__":
    main()
