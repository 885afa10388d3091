"""Prefill (issue 4, 3d): tokens/s and model FLOP utilisation for one prompt of 1k, 4k and 16k
tokens (prefill and the first sampled token, in one engine step). Model FLOPs: 2 x (weights that
every token multiplies: all layers' linear weights) x tokens + the last token's lm_head + causal
attention 4*L*T^2*H*D/2; MFU divides by the bf16 GEMM peak measured in this run (8192^3 matmul).
Peer: one transformers forward over the same prompt, SDPA attention, last-token logits only.

    python -m benchmarks.prefill --checkpoint-dir /tmp/ckpt            # llama3-8b and qwen3-0.6b
    python -m benchmarks.prefill --shape cpu-small --lengths 64 256 --compile-mode none
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from benchmarks import isolate
from benchmarks.common import (
    add_common_args,
    finish,
    per_shape_plot,
    print_table,
    shape_checkpoint,
)
from benchmarks.hardware import gemm_tflops


def model_flops(cfg: dict, tokens: int) -> float:
    """Forward FLOPs of one causal prompt of `tokens` tokens, logits for the last one only."""
    h, layers, v = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    hq, hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // hq
    per_layer = h * d * (2 * hq + 2 * hkv) + 3 * h * cfg["intermediate_size"]
    linear = 2 * layers * per_layer * tokens + 2 * h * v
    attention = 4 * layers * tokens**2 * hq * d / 2
    return linear + attention


def run_shape(shape: str, args, peak_tflops: float) -> list[dict]:
    model_dir = shape_checkpoint(shape, args.checkpoint_dir)
    cfg = json.loads(Path(model_dir, "config.json").read_text())
    common = dict(model_dir=model_dir, dtype=args.dtype, lengths=args.lengths, reps=args.reps)
    ours = isolate.call("benchmarks.ours:prefill", **common, compile_mode=args.compile_mode,
                        cudagraph_mode=args.cudagraph_mode)
    peer = isolate.call("benchmarks.hf_peer:prefill", **common)
    for name, res in (("compiled-llm", ours), ("transformers", peer)):
        if "error" in res:
            print(f"{shape} {name}: {res['error']}")
    secs = {name: {r["length"]: r["seconds"] for r in res.get("rows", [])}
            for name, res in (("ours", ours), ("peer", peer))}
    rows = []
    for n in args.lengths:
        flops = model_flops(cfg, n)
        o, p = secs["ours"].get(n, math.nan), secs["peer"].get(n, math.nan)
        rows.append({"shape": shape, "tokens": n, "model TFLOP": flops / 1e12,
                     "ours tok/s": n / o, "ours MFU %": 100 * flops / o / 1e12 / peak_tflops,
                     "transformers tok/s": n / p,
                     "transformers MFU %": 100 * flops / p / 1e12 / peak_tflops,
                     "ratio": p / o})
    return rows


def panel(ax, shape: str, rs: list[dict]) -> None:
    x = [r["tokens"] for r in rs]
    ax.plot(x, [r["ours MFU %"] for r in rs], "o-", label="compiled-llm")
    ax.plot(x, [r["transformers MFU %"] for r in rs], "^:", label="transformers")
    ax.set(xscale="log", xlabel="prompt tokens", ylabel="MFU % of measured GEMM peak",
           title=f"prefill, {shape}")
    ax.set_xticks(x, labels=[str(n) for n in x])
    ax.minorticks_off()
    ax.legend()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap, ["llama3-8b", "qwen3-0.6b"])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    peak = gemm_tflops()
    print(f"GEMM peak: {peak:,.1f} TFLOP/s")
    rows = [r for shape in args.shape for r in run_shape(shape, args, peak)]
    print_table(rows, f"Prefill, one prompt, {args.dtype}, compile {args.compile_mode}; GEMM "
                f"peak {peak:,.1f} TFLOP/s; ratio = transformers time / ours")
    finish("prefill", args, {"gemm_peak_tflops": peak, "rows": rows}, per_shape_plot(rows, panel))


if __name__ == "__main__":
    main()
