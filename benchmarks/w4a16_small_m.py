"""W4A16 decode with its few-token GEMMs on the Triton GEMV against tinygemm, beside bf16, in one
call: Llama-3-8B shape with random weights packed as benchmarks/quantized.py packs them (group 128),
each variant's engine in its own process with $COMPILED_LLM_W4A16_SMALL_M set for it (gemv, mma,
tinygemm; "tuned": unset, the tuned file's choice). Timed decode windows, tok/s against bf16.

    python -m benchmarks.w4a16_small_m --checkpoint-dir /tmp/ckpt --output-json out.json
"""

from __future__ import annotations

import argparse
import os
from contextlib import contextmanager

from benchmarks.common import print_table, save_json, shape_checkpoint
from benchmarks.quantized import quantized_checkpoint, window_rows
from compiled_llm.quantization.kernels.w4a16_tuning import SMALL_M_ENV

VARIANTS = {"bf16": None, "tinygemm": "tinygemm", "gemv": "gemv", "mma": "mma",
            "tuned": None}


@contextmanager
def small_m_env(value: str | None):
    """$COMPILED_LLM_W4A16_SMALL_M = value (unset for None) while the block runs; child
    processes (benchmarks.isolate) inherit it."""
    before = os.environ.pop(SMALL_M_ENV, None)
    if value is not None:
        os.environ[SMALL_M_ENV] = value
    try:
        yield
    finally:
        os.environ.pop(SMALL_M_ENV, None)
        if before is not None:
            os.environ[SMALL_M_ENV] = before


def add_ratios(rows: list[dict]) -> None:
    """rows["x bf16"] = tok/s over bf16's at the same batch size."""
    base = {row["batch"]: row["tok_s"] for row in rows if row["format"] == "bf16"}
    for row in rows:
        known = row["tok_s"] and base.get(row["batch"])
        row["x bf16"] = row["tok_s"] / base[row["batch"]] if known else None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; window arguments as benchmarks/quantized.py's."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama3-8b")
    ap.add_argument("--checkpoint-dir", default=None)
    ap.add_argument("--variants", nargs="+", default=["bf16", "tinygemm", "gemv"],
                    choices=list(VARIANTS))
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 2, 4])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--compile-mode", default="backend")
    ap.add_argument("--cudagraph-mode", default="full_and_piecewise")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.8)
    ap.add_argument("--output-json", default=None)
    return ap.parse_args(argv)


def main() -> None:
    """Make the checkpoints, run each variant's decode windows, print and save the table."""
    args = parse_args()
    bf16_dir = shape_checkpoint(args.shape, args.checkpoint_dir, tokenizer=True)
    w4a16_dir = quantized_checkpoint(bf16_dir, "w4a16") if set(args.variants) - {"bf16"} else None
    rows: list[dict] = []
    for variant in args.variants:
        label = "bf16" if variant == "bf16" else f"w4a16 {variant}"
        with small_m_env(VARIANTS[variant]):
            rows += window_rows(label, bf16_dir if variant == "bf16" else w4a16_dir, args)
        add_ratios(rows)
        save_json(args.output_json, {"shape": args.shape, "args": vars(args), "rows": rows})
    print_table(rows, f"W4A16 small-M GEMMs: GEMV against tinygemm, {args.shape}")


if __name__ == "__main__":
    main()
