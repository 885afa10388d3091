"""Pipeline parallelism with and without micro-batches in flight: PP=2 step times with
COMPILED_LLM_PP_MICRO_BATCHES=1 (the stages one after another) and 2 (stage 0 runs the second
half of the batch while stage 1 runs the first), against PP=1. A prefill step of every prompt
(max_tokens=1) and decode steps ((time at N tokens - time at 1) / (N - 1)), each engine in its
own process, random weights of the shape's sizes, best of --repeats.

    python -m benchmarks.pp_micro_batches --shape stories15m --num-requests 16 --prompt-len 96
"""

from __future__ import annotations

import argparse
import os
import time

from benchmarks import isolate
from benchmarks.common import SHAPES, print_table, random_ids, save_json, shape_checkpoint

VARIANTS = {"PP=1": (1, None), "PP=2, 1 micro-batch": (2, "1"), "PP=2, 2 micro-batches": (2, "2")}


def step_times(model_dir: str, dtype: str, pipeline: int, micro_batches: str | None,
               prompts: list[list[int]], new_tokens: int, repeats: int) -> dict:
    """Best prefill and decode step seconds of one engine (in a child process)."""
    if micro_batches is not None:
        os.environ["COMPILED_LLM_PP_MICRO_BATCHES"] = micro_batches  # the stages fork after
    from compiled_llm import LLM, SamplingParams

    llm = LLM(model_dir, dtype=dtype, skip_tokenizer_init=True, enable_prefix_caching=False,
              enforce_eager=True, engine_core_process=False, max_model_len=512,
              pipeline_parallel_size=pipeline, kv_cache_memory_bytes=256 << 20)
    batch = [{"prompt_token_ids": p} for p in prompts]

    def run(tokens: int) -> float:
        """Seconds to generate `tokens` for every prompt."""
        params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
        start = time.perf_counter()
        llm.generate(batch, params, use_tqdm=False)
        return time.perf_counter() - start

    try:
        run(2)  # warm-up
        prefill = min(run(1) for _ in range(repeats))
        full = min(run(new_tokens) for _ in range(repeats))
    finally:
        llm.shutdown()
    return {"prefill_s": prefill, "decode_step_s": (full - prefill) / (new_tokens - 1)}


def main() -> None:
    """Run every variant and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="stories15m", choices=list(SHAPES))
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--num-requests", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--new-tokens", type=int, default=17)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--checkpoint-dir", default=None)
    ap.add_argument("--output-json", default=None)
    args = ap.parse_args()
    model_dir = shape_checkpoint(args.shape, args.checkpoint_dir)
    prompts = random_ids(args.num_requests, args.prompt_len, SHAPES[args.shape]["vocab_size"])
    rows = []
    for label, (pipeline, micro) in VARIANTS.items():
        res = isolate.call("benchmarks.pp_micro_batches:step_times", model_dir=model_dir,
                           dtype=args.dtype, pipeline=pipeline, micro_batches=micro,
                           prompts=prompts, new_tokens=args.new_tokens, repeats=args.repeats)
        rows.append({"variant": label, "prefill ms": 1e3 * res.get("prefill_s", float("nan")),
                     "decode step ms": 1e3 * res.get("decode_step_s", float("nan")), "raw": res})
    print_table([{k: v for k, v in row.items() if k != "raw"} for row in rows],
                f"{args.shape}, {args.num_requests} requests of {args.prompt_len} tokens")
    save_json(args.output_json, {"args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
