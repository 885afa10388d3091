"""The multiprocess executor against the uniprocess one, and tensor parallelism on two GPUs.

One GPU: batch-1 decode and the nano-vllm workload (256 requests, input and output lengths
uniform in [100, 1024]), uniprocess against distributed_executor_backend="mp" at
tensor_parallel_size 1 (rank 0 lives in the engine's process, so this measures what the mp
path adds there). Two or more GPUs (or --tp2): TP=2 greedy tokens against TP=1's on the same
prompts, and TP=2 batch-1 decode against TP=1's. Each engine runs in its own process; random
weights of the shape's real sizes; results printed and written to --output-json.

    python -m benchmarks.tp_executor --shape qwen3-0.6b --checkpoint-dir /tmp/ckpt \\
        --output-json bench_out/tp_executor.json
    python -m benchmarks.tp_executor --shape cpu-small --num-requests 8 --input-len 16 64 \\
        --output-len 8 32 --compile-mode none --new-tokens 16 --tp2     # CPU smoke
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks import isolate
from benchmarks.common import print_table, random_ids, save_json, shape_checkpoint
from benchmarks.throughput import workload

UNI = {"distributed_executor_backend": "uni"}
MP1 = {"distributed_executor_backend": "mp", "tensor_parallel_size": 1}
TP2 = {"distributed_executor_backend": "mp", "tensor_parallel_size": 2}


def greedy(model_dir: str, dtype: str, compile_mode: str, prompts: list[list[int]],
           new_tokens: int, engine_kw: dict) -> dict:
    """Greedy tokens of every prompt (in a child process)."""
    from benchmarks.ours import make_llm
    from compiled_llm import SamplingParams

    llm = make_llm(model_dir, dtype, compile_mode, "none", max_model_len=512, **engine_kw)
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return {"tokens": [o.outputs[0].token_ids for o in outs]}


def _decode(args, model_dir: str, engine_kw: dict, label: str) -> dict:
    res = isolate.call("benchmarks.ours:decode", model_dir=model_dir, dtype=args.dtype,
                       compile_mode=args.compile_mode, cudagraph_mode=args.cudagraph_mode,
                       batch_sizes=[1], prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                       async_scheduling=True, engine_kw=engine_kw)
    tok_s = res["rows"][0]["tok_s"] if "rows" in res else float("nan")
    return {"phase": "batch-1 decode", "executor": label, "tok/s": tok_s, "raw": res}


def _offline(args, model_dir: str, prompts, outs, engine_kw: dict, label: str) -> dict:
    res = isolate.call("benchmarks.ours:offline", model_dir=model_dir, dtype=args.dtype,
                       compile_mode=args.compile_mode, cudagraph_mode=args.cudagraph_mode,
                       prompts=prompts, outs=outs,
                       max_model_len=args.input_len[1] + args.output_len[1],
                       async_scheduling=True, engine_kw=engine_kw)
    tok_s = res["output_tokens"] / res["seconds"] if "seconds" in res else float("nan")
    return {"phase": "nano-vllm offline", "executor": label, "tok/s": tok_s, "raw": res}


def _with_ratios(rows: list[dict]) -> list[dict]:
    """Each row's tok/s against the first row of its phase (the reference)."""
    base: dict[str, float] = {}
    for row in rows:
        base.setdefault(row["phase"], row["tok/s"])
        row["vs first"] = row["tok/s"] / base[row["phase"]]
    return rows


def _two_gpus(args, model_dir: str, vocab: int) -> tuple[list[dict], dict]:
    prompts = random_ids(8, 48, vocab, seed=3)
    common = dict(model_dir=model_dir, dtype=args.dtype, compile_mode=args.compile_mode,
                  prompts=prompts, new_tokens=32)
    one = isolate.call("benchmarks.tp_executor:greedy", **common, engine_kw=UNI)
    two = isolate.call("benchmarks.tp_executor:greedy", **common, engine_kw=TP2)
    equal = "tokens" in one and one.get("tokens") == two.get("tokens")
    rows = [_decode(args, model_dir, UNI, "TP=1 uni"), _decode(args, model_dir, TP2, "TP=2 mp")]
    for row in rows:
        row["phase"] = "batch-1 decode, TP"
    return rows, {"greedy_equal": equal, "tp1_error": one.get("error"),
                  "tp2_error": two.get("error")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument("--checkpoint-dir", default=None)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--compile-mode", default="backend")
    ap.add_argument("--cudagraph-mode", default="full_and_piecewise")
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--input-len", type=int, nargs=2, default=[100, 1024])
    ap.add_argument("--output-len", type=int, nargs=2, default=[100, 1024])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--tp2", action="store_true", help="run the TP=2 part (default: 2+ GPUs)")
    ap.add_argument("--output-json", default=None)
    args = ap.parse_args()
    model_dir = shape_checkpoint(args.shape, args.checkpoint_dir)
    vocab = json.loads(Path(model_dir, "config.json").read_text())["vocab_size"]
    prompts, outs = workload(args.num_requests, vocab, args.input_len, args.output_len, 0)
    rows = [_decode(args, model_dir, UNI, "uni"), _decode(args, model_dir, MP1, "mp, TP=1"),
            _offline(args, model_dir, prompts, outs, UNI, "uni"),
            _offline(args, model_dir, prompts, outs, MP1, "mp, TP=1")]
    payload: dict = {"args": vars(args)}
    if args.tp2 or _gpu_count() >= 2:
        tp_rows, payload["tp2"] = _two_gpus(args, model_dir, vocab)
        rows += tp_rows
    payload["rows"] = _with_ratios(rows)
    print_table([{k: v for k, v in r.items() if k != "raw"} for r in rows],
                f"executors, shape {args.shape}")
    if "tp2" in payload:
        print(f"TP=2 greedy tokens equal TP=1's: {payload['tp2']['greedy_equal']}")
    save_json(args.output_json, payload)


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


if __name__ == "__main__":
    main()
