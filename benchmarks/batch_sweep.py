"""Batch sweep (issue 4, 3c): decode tokens/s at batch 1, 8, 32, 64, 128 and 256 (128-token
prompts, 128 timed tokens each), with CUDA graphs on (full_and_piecewise) and off (none), and
graphs on with async scheduling (--scheduling), one engine per mode; the engine's step timer
gives the host time per decode step beside the device time (the CPU-overhead target is read at
batch 64, graphs on). Peer: transformers with a static
cache and torch.compile at the same sizes, until --peer-budget-s is spent (sizes left are listed).

    python -m benchmarks.batch_sweep --checkpoint-dir /tmp/ckpt      # llama3-8b and qwen3-0.6b
    python -m benchmarks.batch_sweep --shape cpu-small --batch-sizes 1 4 --new-tokens 8 \\
        --compile-mode none --peer-budget-s 30                          # CPU smoke
"""

from __future__ import annotations

import argparse
import math

from benchmarks import isolate
from benchmarks.common import (
    add_common_args,
    finish,
    per_shape_plot,
    print_table,
    shape_checkpoint,
)


def run_shape(shape: str, args) -> tuple[list[dict], dict]:
    """Rows per batch size, and the batch sizes the peer skipped (budget) or failed at."""
    model_dir = shape_checkpoint(shape, args.checkpoint_dir)
    common = dict(model_dir=model_dir, dtype=args.dtype, compile_mode=args.compile_mode,
                  batch_sizes=args.batch_sizes, prompt_len=args.prompt_len,
                  new_tokens=args.new_tokens)
    on = isolate.call("benchmarks.ours:decode", **common, cudagraph_mode=args.cudagraph_mode)
    off = isolate.call("benchmarks.ours:decode", **common, cudagraph_mode="none")
    asy = {}
    if "async" in args.scheduling:
        asy = isolate.call("benchmarks.ours:decode", **common, cudagraph_mode=args.cudagraph_mode,
                           async_scheduling=True)
    peer = {"rows": [], "skipped": list(args.batch_sizes)}
    if args.peer_budget_s > 0:
        peer = isolate.call("benchmarks.hf_peer:static_decode", **common,
                            budget_s=args.peer_budget_s)
    runs = (("on", on), ("off", off), ("async", asy), ("peer", peer))
    for name, res in runs:
        if "error" in res:
            print(f"{shape} {name}: {res['error']}")
    by = {name: {r["batch"]: r for r in res.get("rows", [])} for name, res in runs}
    rows = [_row(shape, b, by) for b in args.batch_sizes]
    return rows, {"skipped": peer.get("skipped", list(args.batch_sizes)),
                  "failed": peer.get("failed", {})}


def _row(shape: str, b: int, by: dict) -> dict:
    on, off, asy, peer = (by[k].get(b, {}) for k in ("on", "off", "async", "peer"))
    nan = math.nan
    # exposed host time: the step's wall time beyond its device time (what async hides)
    exposed = asy.get("ms_per_step", nan) - asy.get("gpu_ms", nan)
    row = {"shape": shape, "batch": b, "graphs on tok/s": on.get("tok_s", nan),
           "graphs off tok/s": off.get("tok_s", nan),
           "on + async tok/s": asy.get("tok_s", nan),
           "transformers tok/s": peer.get("tok_s", nan),
           "step ms (on)": on.get("ms_per_step", nan), "gpu ms (on)": on.get("gpu_ms", nan),
           "cpu ms (on)": on.get("cpu_ms", nan), "cpu % of gpu": on.get("cpu_pct_of_gpu", nan),
           "cpu ms (off)": off.get("cpu_ms", nan),
           # where the host time goes: scheduler / input build / outputs (graphs on)
           "sched/prep/out ms": "/".join(f"{on.get(k, nan):.2f}" for k in
                                         ("schedule_ms", "prepare_ms", "output_ms")),
           "step ms (async)": asy.get("ms_per_step", nan), "gpu ms (async)": asy.get("gpu_ms", nan),
           "exposed host % (async)": 100 * exposed / asy.get("gpu_ms", nan)}
    row["on / off"] = row["graphs on tok/s"] / row["graphs off tok/s"]
    row["ratio"] = max(row["graphs on tok/s"], row["on + async tok/s"]) / row[
        "transformers tok/s"]
    return row


def panel(ax, shape: str, rs: list[dict]) -> None:
    for key, style in (("graphs on tok/s", "o-"), ("on + async tok/s", "d-"),
                       ("graphs off tok/s", "s--"), ("transformers tok/s", "^:")):
        ax.plot([r["batch"] for r in rs], [r[key] for r in rs], style,
                label=key.replace(" tok/s", ""))
    ax.set(xscale="log", yscale="log", xlabel="batch", ylabel="decode tokens/s",
           title=f"decode batch sweep, {shape}")
    ax.set_xticks([r["batch"] for r in rs], labels=[str(r["batch"]) for r in rs])
    ax.minorticks_off()
    ax.legend()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap, ["llama3-8b", "qwen3-0.6b"])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--overhead-batch", type=int, default=64)
    ap.add_argument("--peer-budget-s", type=float, default=90.0,
                    help="per shape, from the peer's load; later sizes are skipped (0: no peer)")
    args = ap.parse_args()
    rows, peer = [], {}
    for shape in args.shape:
        shape_rows, peer[shape] = run_shape(shape, args)
        rows += shape_rows
    print_table(rows, f"Decode batch sweep: {args.prompt_len}-token prompts, {args.new_tokens} "
                f"timed tokens, {args.dtype}, compile {args.compile_mode}; "
                "ratio = best of graphs on (sync, async) / transformers")
    for shape in args.shape:
        at = [r for r in rows if r["shape"] == shape and r["batch"] == args.overhead_batch]
        if at:
            print(f"{shape}: CPU overhead per decode step at batch {args.overhead_batch} "
                  f"(graphs on): {at[0]['cpu ms (on)']:.3f} ms = {at[0]['cpu % of gpu']:.1f}% "
                  "of the step's GPU time (target <= 10%)")
            if not math.isnan(at[0]["step ms (async)"]):
                print(f"{shape}: with async scheduling, wall per step beyond GPU time at batch "
                      f"{args.overhead_batch}: {at[0]['exposed host % (async)']:.1f}% of GPU time")
        if peer[shape]["skipped"]:
            print(f"{shape}: transformers skipped at batch {peer[shape]['skipped']} "
                  f"(--peer-budget-s {args.peer_budget_s:g} spent)")
        for b, err in peer[shape]["failed"].items():
            print(f"{shape}: transformers failed at batch {b}: {err}")
    finish("batch_sweep", args, {"rows": rows, "peer": peer}, per_shape_plot(rows, panel))


if __name__ == "__main__":
    main()
