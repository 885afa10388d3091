"""Offline throughput, the nano-vllm workload (issue 4, 3a): 256 requests, input and output
lengths each uniform in [100, 1024] (seed 0), greedy, ignore_eos; output tokens/s of
compiled-llm against transformers' own continuous batching on the same checkpoint, each in its
own process of the same run.

    python -m benchmarks.offline_throughput --shape qwen3-0.6b --checkpoint-dir /tmp/ckpt
    python -m benchmarks.offline_throughput --shape llama3-8b --checkpoint-dir /tmp/ckpt
    python -m benchmarks.offline_throughput --shape cpu-small --num-requests 8 \\
        --input-len 16 64 --output-len 8 32 --compile-mode none            # CPU smoke

The peer (default --peer-api manager) is the manager behind `generate_batch`, given each
request's own max_new_tokens, so it runs the exact workload; it is stopped after
--peer-max-seconds and counts the tokens made by then (it runs at full concurrency, so this
favours it). --peer-api generate_batch calls `generate_batch` once with the longest output for
every request and counts only the requested tokens.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks import isolate
from benchmarks.common import (
    add_common_args,
    finish,
    per_shape_plot,
    print_table,
    shape_checkpoint,
)
from benchmarks.throughput import workload


def run_shape(shape: str, args) -> list[dict]:
    model_dir = shape_checkpoint(shape, args.checkpoint_dir)
    vocab = json.loads(Path(model_dir, "config.json").read_text())["vocab_size"]
    prompts, outs = workload(args.num_requests, vocab, args.input_len, args.output_len,
                             args.seed)
    common = dict(model_dir=model_dir, dtype=args.dtype, prompts=prompts, outs=outs)
    rows = []
    if args.peer_max_seconds > 0:
        peer = isolate.call("benchmarks.hf_peer:continuous_batching", **common,
                            max_seconds=args.peer_max_seconds, api=args.peer_api)
        rows.append(_row(shape, f"transformers CB ({args.peer_api})", peer, len(prompts)))
    for mode in args.scheduling:
        ours = isolate.call("benchmarks.ours:offline", **common, compile_mode=args.compile_mode,
                            cudagraph_mode=args.cudagraph_mode,
                            max_model_len=args.input_len[1] + args.output_len[1],
                            async_scheduling=mode == "async")
        name = args.compile_mode + (", async" if mode == "async" else "")
        rows.append(_row(shape, f"compiled-llm ({name})", ours, len(prompts)))
    peer_tps = rows[0]["output tok/s"] if args.peer_max_seconds > 0 else float("nan")
    for r in rows:
        r["ratio"] = r["output tok/s"] / peer_tps
    return rows


def _row(shape: str, engine: str, res: dict, n: int) -> dict:
    if "error" in res:
        print(f"{shape} {engine}: {res['error']}")
        return {"shape": shape, "engine": engine, "finished": "error", "output tokens": 0,
                "seconds": float("nan"), "cpu % of gpu": "", "output tok/s": float("nan"),
                "raw": res}
    done = res.get("finished", n)
    return {"shape": shape, "engine": engine,
            "finished": f"{done}/{n}" + (" (capped)" if res.get("capped") else ""),
            "output tokens": res["output_tokens"], "seconds": res["seconds"],
            "cpu % of gpu": f"{res['cpu_pct_of_gpu']:.1f}" if "cpu_pct_of_gpu" in res else "",
            "output tok/s": res["output_tokens"] / res["seconds"], "raw": res}


def panel(ax, shape: str, rs: list[dict]) -> None:
    bars = ax.bar([r["engine"] for r in rs], [r["output tok/s"] for r in rs],
                  color=["tab:gray" if "transformers" in r["engine"] else "tab:blue" for r in rs])
    ax.bar_label(bars, labels=[f"x{r['ratio']:.1f}" for r in rs])
    ax.set(ylabel="output tokens/s", title=f"offline throughput, {shape}")
    ax.tick_params(axis="x", labelsize=7)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap, ["qwen3-0.6b"])
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--input-len", type=int, nargs=2, default=[100, 1024])
    ap.add_argument("--output-len", type=int, nargs=2, default=[100, 1024])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--peer-api", default="manager", choices=["manager", "generate_batch"])
    ap.add_argument("--peer-max-seconds", type=float, default=60.0,
                    help="stop the peer after this long (0: no peer)")
    args = ap.parse_args()
    rows = [r for shape in args.shape for r in run_shape(shape, args)]
    table = [{k: v for k, v in r.items() if k != "raw"} for r in rows]
    print_table(table, f"Offline throughput: {args.num_requests} requests, input "
                f"{args.input_len}, output {args.output_len}, ratio = / transformers CB")
    finish("offline_throughput", args, {"rows": rows}, per_shape_plot(rows, panel, width=5))


if __name__ == "__main__":
    main()
