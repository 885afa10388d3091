"""Batch-1 decode (issue 4, 3b): a 128-token prompt, then 256 greedy tokens timed step by step;
decode tokens/s and the share of copy bandwidth it implies (weight bytes x tokens/s / copy
bandwidth, both measured in this run; the copy counts bytes read plus written). Peers (--peer,
one or both; ratio = / the first named): transformers with a static cache and generate's own
compile of the decode step (CompileConfig(mode="reduce-overhead", fullgraph=True)), warmed up
by one generate first; gpt-fast's own generate.py from .peer/gpt-fast (benchmarks.gptfast_peer:
Llama shapes, bfloat16). Each side runs in its own process.

    python -m benchmarks.decode_latency --checkpoint-dir /tmp/ckpt     # llama3-8b, qwen3-0.6b
    python -m benchmarks.decode_latency --shape cpu-small --new-tokens 16 --compile-mode none
    python -m benchmarks.decode_latency --shape llama3-8b --checkpoint-dir /tmp/ckpt \
        --peer gptfast --scheduling async
"""

from __future__ import annotations

import argparse
import math

from benchmarks import isolate
from benchmarks.common import (
    SHAPES,
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
    rows = [_row(shape, *_peer(name, common, args), wbytes, bw_gbs) for name in args.peer]
    for mode, res in ours.items():
        name = args.compile_mode + (", async" if mode == "async" else "")
        rows.append(_row(shape, f"compiled-llm ({name})", res, wbytes, bw_gbs))
    for r in rows:
        r["ratio"] = r["decode tok/s"] / rows[0]["decode tok/s"]
    return rows


def _peer(name: str, common: dict, args) -> tuple[str, dict]:
    """The named peer's label and result, run in its own process."""
    eager = args.compile_mode == "none"
    if name == "gptfast":
        res = isolate.call("benchmarks.gptfast_peer:decode", **common,
                           num_samples=args.gptfast_samples)
        return "gpt-fast " + ("(eager)" if eager else "(reduce-overhead, fullgraph)"), res
    res = isolate.call("benchmarks.hf_peer:static_decode", **common)
    return "transformers static cache" + (" (eager)" if eager else " + torch.compile"), res


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
                  color=["tab:gray", "tab:olive", "tab:blue", "tab:green"][: len(rs)])
    ax.bar_label(bars, labels=[f"{r['% copy bw']:.0f}% bw" for r in rs])
    ax.set(title=f"batch-1 decode, {shape}", ylabel="tokens/s")
    ax.tick_params(axis="x", labelsize=7)


def _check_gptfast(ap: argparse.ArgumentParser, args) -> None:
    """Refuse up front what gpt-fast's generate.py cannot run (see benchmarks.gptfast_peer)."""
    if "gptfast" not in args.peer:
        return
    if args.dtype != "bfloat16":
        ap.error(f"--peer gptfast: generate.py runs bfloat16 only, not --dtype {args.dtype}")
    other = [s for s in args.shape if SHAPES[s]["arch"] != "LlamaConfig"]
    if other:
        ap.error(f"--peer gptfast: gpt-fast's model is Llama only, not --shape {' '.join(other)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap, ["llama3-8b", "qwen3-0.6b"])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--peer", nargs="+", default=["transformers"],
                    choices=["transformers", "gptfast"],
                    help="the peers measured in this run, the first the ratios' base")
    ap.add_argument("--gptfast-samples", type=int, default=5,
                    help="generate.py --num_samples (timed generations after its warm-up)")
    args = ap.parse_args()
    _check_gptfast(ap, args)
    bw = copy_bandwidth_gbs()
    print(f"copy bandwidth (read + write): {bw:,.0f} GB/s")
    rows = [r for shape in args.shape for r in run_shape(shape, args, bw)]
    table = [{k: v for k, v in r.items() if k != "raw"} for r in rows]
    print_table(table, f"Batch-1 decode: {args.prompt_len}-token prompt, {args.new_tokens} "
                f"tokens, {args.dtype}; copy bandwidth {bw:,.0f} GB/s; ratio = / {args.peer[0]}")
    for shape in args.shape:
        print(f"{shape}: {TARGETS.get(shape, 'no target')}")
    finish("decode_latency", args, {"copy_bw_gbs": bw, "rows": rows},
           per_shape_plot(rows, panel, width=5))


if __name__ == "__main__":
    main()
