"""Horizontal GEMM fusion (issue 14, item 1): decode tokens/s at batch 1, 8 and 32 with the fused
layer (q/k/v and gate/up as one matmul each: 4 per layer) against the unfused one (7 per layer,
`passes={"enable_horizontal_gemm": false}`), CUDA graphs on, async scheduling (the default),
each engine in its own process; the optional FP8 pair runs `quantization="fp8"`.

    python -m benchmarks.horizontal_gemm --checkpoint-dir /tmp/ckpt        # llama3-8b, qwen3-0.6b
    python -m benchmarks.horizontal_gemm --shape cpu-small --batch-sizes 1 --new-tokens 8
"""

from __future__ import annotations

import argparse
import math

from benchmarks import isolate
from benchmarks.common import add_common_args, finish, print_table, shape_checkpoint

OFF = {"enable_horizontal_gemm": False}


def run_shape(shape: str, args) -> list[dict]:
    """One row per batch size: fused and unfused tok/s and their ratio."""
    common = dict(model_dir=shape_checkpoint(shape, args.checkpoint_dir), dtype=args.dtype,
                  compile_mode=args.compile_mode, cudagraph_mode=args.cudagraph_mode,
                  batch_sizes=args.batch_sizes, prompt_len=args.prompt_len,
                  new_tokens=args.new_tokens, async_scheduling=True)
    runs = {"fused": isolate.call("benchmarks.ours:decode", **common),
            "unfused": isolate.call("benchmarks.ours:decode", **common, passes=OFF)}
    for name, res in runs.items():
        if "error" in res:
            print(f"{shape} {name}: {res['error']}")
    by = {name: {r["batch"]: r for r in res.get("rows", [])} for name, res in runs.items()}
    rows = []
    for batch in args.batch_sizes:
        fused, unfused = (by[k].get(batch, {}).get("tok_s", math.nan) for k in by)
        rows.append({"shape": shape, "batch": batch, "fused tok/s": fused,
                     "unfused tok/s": unfused, "fused / unfused": fused / unfused,
                     "fused step ms": 1e3 * batch / fused})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap, ["llama3-8b", "qwen3-0.6b"])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    args = ap.parse_args()
    rows = [row for shape in args.shape for row in run_shape(shape, args)]
    print_table(rows, f"Horizontal GEMM fusion: decode, {args.prompt_len}-token prompts, "
                f"{args.new_tokens} timed tokens, {args.dtype}, graphs {args.cudagraph_mode}, "
                "async")
    finish("horizontal_gemm", args, {"rows": rows}, None)


if __name__ == "__main__":
    main()
