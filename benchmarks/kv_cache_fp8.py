"""FP8 KV cache (issue 19, item 4): decode tokens/s of long-context batches with
kv_cache_dtype="fp8" against the model's dtype (auto), and the KV blocks each fits in the same
memory, CUDA graphs on, async scheduling (the default), each engine in its own process.

    python -m benchmarks.kv_cache_fp8 --checkpoint-dir /tmp/ckpt           # llama3-8b
    python -m benchmarks.kv_cache_fp8 --shape cpu-small --batch-sizes 4 --prompt-len 64
"""

from __future__ import annotations

import math

from benchmarks.common import decode_pair_main, decode_runs


def run_shape(shape: str, args) -> list[dict]:
    """One row per batch size: auto and fp8 tok/s, their ratio, and the blocks each holds."""
    runs, tok_s = decode_runs(shape, args, {kind: {"engine_kw": {"kv_cache_dtype": kind}}
                                            for kind in ("auto", "fp8")})
    rows = []
    for batch in args.batch_sizes:
        auto, fp8 = (tok_s[k].get(batch, math.nan) for k in ("auto", "fp8"))
        rows.append({"shape": shape, "batch": batch, "auto tok/s": auto, "fp8 tok/s": fp8,
                     "fp8 / auto": fp8 / auto,
                     "auto KV blocks": runs["auto"].get("kv_blocks", math.nan),
                     "fp8 KV blocks": runs["fp8"].get("kv_blocks", math.nan)})
    return rows


def main() -> None:
    decode_pair_main("kv_cache_fp8", __doc__, "FP8 KV cache", ["llama3-8b"], run_shape,
                     [64, 256], 1024, 128)


if __name__ == "__main__":
    main()
