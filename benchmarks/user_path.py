"""The user's path, timed: `LLM(model=DIR)` with default settings and `LLM.generate` with the
workload's own sampling. Imports only the public `compiled_llm` API and the nano-vllm workload
of `compiled-llm bench throughput --dataset-name nano-vllm`, so the same file times any tree
from that command's on put on PYTHONPATH (e.g. a tree before and after a refactor, in one run).

    python benchmarks/user_path.py --model /tmp/ckpt/qwen3-0.6b --workload nano-vllm
    python benchmarks/user_path.py --model /tmp/ckpt/llama3-8b --workload decode --json out.json

nano-vllm: 256 requests, prompt and output lengths uniform in [100, 1024] (seed 0), random
token ids, temperature 0.6, ignore_eos; output tokens/s over the whole generate call.
decode: one 128-token prompt, 256 new tokens, greedy, ignore_eos; tokens/s after the first.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

TUNED_ENGINE = {"enable_prefix_caching": False, "max_model_len": 2048}
TUNED_SAMPLING = {"temperature": 0.0, "detokenize": False}


def run_nano_vllm(llm, sampling_params_cls, overrides: dict | None = None) -> dict:
    """Output tokens/s of the nano-vllm workload (one warm-up request first); overrides
    replace SamplingParams fields (a tuned path: greedy, detokenize off ...)."""
    from compiled_llm.entrypoints.cli.bench import nano_vllm_workload

    prompts, params = nano_vllm_workload(llm)
    params = [dataclasses.replace(p, **(overrides or {})) for p in params]
    llm.generate([{"prompt_token_ids": [1] * 16}], sampling_params_cls(max_tokens=4),
                 use_tqdm=False)
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"requests": len(prompts), "output_tokens": tokens, "seconds": seconds,
            "output_tok_s": tokens / seconds}


def run_decode(llm, sampling_params_cls, new_tokens: int = 256, batch: int = 1) -> dict:
    """Decode tokens/s of `batch` 128-token prompts (distinct ids), greedy; the prefill step
    excluded (timed alone, then subtracted). Batch 1 keeps the prompt it always had."""
    prompts = [{"prompt_token_ids": [(7 * i + seq) % 1000 + 1 for i in range(128)]}
               for seq in range(batch)]
    first = sampling_params_cls(temperature=0.0, max_tokens=1, ignore_eos=True)
    full = sampling_params_cls(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    llm.generate(prompts, full, use_tqdm=False)  # warm-up
    best = {}
    for _ in range(3):
        start = time.perf_counter()
        llm.generate(prompts, first, use_tqdm=False)
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        llm.generate(prompts, full, use_tqdm=False)
        decode = time.perf_counter() - start - prefill
        rate = batch * (new_tokens - 1) / decode
        if rate > best.get("tok_s", 0.0):
            best = {"tok_s": rate, "ms_per_token": 1e3 * batch / rate, "batch": batch,
                    "new_tokens": new_tokens}
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--workload", nargs="+", default=["decode", "nano-vllm"],
                    choices=["decode", "nano-vllm"])
    ap.add_argument("--label", default="")
    ap.add_argument("--skip-tokenizer-init", action="store_true",
                    help="for a checkpoint without a usable tokenizer (decode only)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--engine-args", type=json.loads, default={},
                    help="EngineArgs overrides as JSON (a tuned path; default: none)")
    ap.add_argument("--sampling", type=json.loads, default={},
                    help="SamplingParams overrides for nano-vllm as JSON (default: none)")
    ap.add_argument("--preset", choices=["default", "tuned"], default="default",
                    help="tuned: the benchmark's old path (greedy, no detokenization, no prefix "
                         "caching, max_model_len 2048) under the overrides")
    args = ap.parse_args()
    if args.preset == "tuned":
        args.engine_args = {**TUNED_ENGINE, **args.engine_args}
        args.sampling = {**TUNED_SAMPLING, **args.sampling}
    from compiled_llm import LLM, SamplingParams

    start = time.perf_counter()
    llm = LLM(model=args.model, skip_tokenizer_init=args.skip_tokenizer_init,
              **args.engine_args)
    row = {"label": args.label, "model": args.model, "startup_s": time.perf_counter() - start,
           "engine_args": args.engine_args, "sampling": args.sampling}
    if "decode" in args.workload:
        row["decode"] = run_decode(llm, SamplingParams)
    if "nano-vllm" in args.workload:
        row["nano_vllm"] = run_nano_vllm(llm, SamplingParams, args.sampling)
    print(json.dumps(row))
    if args.json:
        with open(args.json, "a") as out:
            out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
