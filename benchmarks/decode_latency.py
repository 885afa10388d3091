"""Batch-1 decode (issue 4, 3b): a 128-token prompt, then 256 greedy tokens timed step by step;
decode tokens/s and the share of copy bandwidth it implies (weight bytes x tokens/s / copy
bandwidth, both measured in this run; the copy counts bytes read plus written). Peer:
transformers with a static cache and generate's own compile of the decode step
(CompileConfig(mode="reduce-overhead", fullgraph=True)), warmed up by one generate first.
Each side runs in its own process.

    python -m benchmarks.decode_latency --checkpoint-dir /tmp/ckpt     # llama3-8b, qwen3-0.6b
    python -m benchmarks.decode_latency --shape cpu-small --new-tokens 16 --compile-mode none
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
from benchmarks.hardware import copy_bandwidth_gbs

TARGETS = {"llama3-8b": "target >= 92% of copy bandwidth (~240 tok/s)",
           "qwen3-0.6b": "target >= 1,200 tok/s"}


def run_shape(shape: str, args, bw_gbs: float) -> list[dict]:
    model_dir = shape_checkpoint(shape, args.checkpoint_dir)
    common = dict(model_dir=model_dir, dtype=args.dtype, compile_mode=args.compile_mode,
                  batch_sizes=[1], prompt_len=args.prompt_len, new_tokens=args.new_tokens)
    ours = {mode: isolate.call("benchmarks.ours:decode", **common,
                               cudagraph_mode=args.cudagraph_mode,
                               async_scheduling=mode == "async") for mode in args.scheduling}
    wbytes = next(iter(ours.values())).get("weight_bytes", math.nan)
    peer = isolate.call("benchmarks.hf_peer:static_decode", **common)
    peer_name = "transformers static cache" + (
        " + torch.compile" if args.compile_mode != "none" else " (eager)")
    rows = [_row(shape, peer_name, peer, wbytes, bw_gbs)]
    for mode, res in ours.items():
        name = args.compile_mode + (", async" if mode == "async" else "")
        rows.append(_row(shape, f"compiled-llm ({name})", res, wbytes, bw_gbs))
    for r in rows:
        r["ratio"] = r["decode tok/s"] / rows[0]["decode tok/s"]
    return rows


def _row(shape: str, engine: str, res: dict, wbytes: float, bw_gbs: float) -> dict:
    if "error" in res:
        print(f"{shape} {engine}: {res['error']}")
    tps = res["rows"][0]["tok_s"] if "rows" in res else math.nan
    gbs = wbytes * tps / 1e9
    return {"shape": shape, "engine": engine, "decode tok/s": tps, "ms/token": 1e3 / tps,
            "weights GB": wbytes / 1e9, "implied GB/s": gbs, "% copy bw": 100 * gbs / bw_gbs,
            "raw": res}


def panel(ax, shape: str, rs: list[dict]) -> None:
    bars = ax.bar([r["engine"] for r in rs], [r["decode tok/s"] for r in rs],
                  color=["tab:gray", "tab:blue", "tab:green"][: len(rs)])
    ax.bar_label(bars, labels=[f"{r['% copy bw']:.0f}% bw" for r in rs])
    ax.set(title=f"batch-1 decode, {shape}", ylabel="tokens/s")
    ax.tick_params(axis="x", labelsize=7)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap, ["llama3-8b", "qwen3-0.6b"])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    args = ap.parse_args()
    bw = copy_bandwidth_gbs()
    print(f"copy bandwidth (read + write): {bw:,.0f} GB/s")
    rows = [r for shape in args.shape for r in run_shape(shape, args, bw)]
    table = [{k: v for k, v in r.items() if k != "raw"} for r in rows]
    print_table(table, f"Batch-1 decode: {args.prompt_len}-token prompt, {args.new_tokens} "
                f"tokens, {args.dtype}; copy bandwidth {bw:,.0f} GB/s; ratio = / transformers")
    for shape in args.shape:
        print(f"{shape}: {TARGETS.get(shape, 'no target')}")
    finish("decode_latency", args, {"copy_bw_gbs": bw, "rows": rows},
           per_shape_plot(rows, panel, width=5))


if __name__ == "__main__":
    main()
