"""Host time per decode step (issue 4, lean runner): the engine's step timer over decode windows
at one batch size, split into schedule / prepare / output, plus prepare() alone in a warm loop
(what the host costs when the forward does not evict its caches, as on a GPU).

    python -m benchmarks.host_step --shape cpu-small --batch 64 --compile-mode none
    python -m benchmarks.host_step --shape qwen3-0.6b --batch 64 --checkpoint-dir /tmp/ckpt
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.common import default_dtype, shape_checkpoint
from benchmarks.ours import decode_window, make_llm

KEYS = ("schedule_ms", "prepare_ms", "output_ms", "cpu_ms", "gpu_ms", "cpu_pct_of_gpu")


def warm_prepare_us(engine, batch: int, prompt_len: int, reps: int = 500) -> float:
    """Mean microseconds of runner.prepare for one decode step of `batch` requests."""
    from compiled_llm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    ids = [f"prep-{i}" for i in range(batch)]
    for rid in ids:
        engine.add_request(rid, {"prompt_token_ids": [1] * prompt_len}, params)
    while any(not engine.parents[rid][0].output_token_ids for rid in ids):
        engine.step()
    sched = engine.scheduler.schedule()  # a pure decode step of the whole batch
    runner = engine.executor.worker.runner
    with torch.inference_mode():
        t = time.perf_counter()
        for _ in range(reps):
            runner.input_batch.prepare(sched)
        us = 1e6 * (time.perf_counter() - t) / reps
        result = runner.execute(sched)  # the step runs before the scheduler advances it
        engine.scheduler.advance(sched)
        engine.scheduler.resolve(sched, result.sampled)
    while engine.has_unfinished_requests():
        engine.step()
    return us


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="cpu-small")
    ap.add_argument("--checkpoint-dir", default=None)
    ap.add_argument("--dtype", default=default_dtype())
    ap.add_argument("--compile-mode", default="backend", choices=["backend", "stock", "none"])
    ap.add_argument("--cudagraph-mode", default="full_and_piecewise")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--windows", type=int, default=3)
    args = ap.parse_args()

    def build(**kw):
        return make_llm(shape_checkpoint(args.shape, args.checkpoint_dir), args.dtype,
                        args.compile_mode, args.cudagraph_mode, max_num_seqs=args.batch,
                        max_model_len=args.prompt_len + args.new_tokens + 32, **kw)

    llm = build()
    eng = llm.engine
    decode_window(eng, args.batch, args.prompt_len, 4, "warm")
    rows = [decode_window(eng, args.batch, args.prompt_len, args.new_tokens, f"w{i}")
            for i in range(args.windows)]
    print(f"{args.shape}, batch {args.batch}, {args.compile_mode}, per decode step:")
    for k in KEYS:
        print(f"  {k:16s}" + "".join(f"{r[k]:9.3f}" for r in rows))
    llm.shutdown()
    # the warm loop runs steps by hand: one step at a time, so on a synchronous engine (an
    # asynchronous one's scheduled steps wait on the tokens of a launched one)
    sync = build(async_scheduling=False)
    us = warm_prepare_us(sync.engine, args.batch, args.prompt_len)
    sync.shutdown()
    print(f"  prepare() alone, warm loop: {us:.1f} us")


if __name__ == "__main__":
    main()
