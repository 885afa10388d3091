"""Tune the fused MoE kernel's tile configs for one layer shape on this GPU: for each token
count, time every candidate config (checked against the reference first; replays of a CUDA
graph, so launch overhead does not count) and keep the fastest,
then write the tuned file that compiled_llm.moe.tuning reads (default: the shipped configs).

    python -m benchmarks.moe_tune --experts 128 --top-k 8 --hidden 2048 --inter 768 \\
        --out-dir $OUT/moe_configs [--json $OUT/moe_tune.json]
"""

from __future__ import annotations

import argparse
import itertools
import math
from pathlib import Path

import torch

from benchmarks.common import print_table, save_json
from benchmarks.moe_kernels import inputs, time_ms
from compiled_llm.moe import fused_moe_reference
from compiled_llm.moe.kernels import MoeGemmConfig
from compiled_llm.moe.triton_moe import fused_moe_triton, moe_gemm_config
from compiled_llm.moe.tuning import SHIPPED_DIR, config_file_name, save_tuned

TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]


def candidates(per_expert: float) -> list[MoeGemmConfig]:
    """Configs worth timing at this many routed rows per expert (block_m near it)."""
    if per_expert <= 16:
        space = ([16], [32, 64, 128], [64, 128, 256], [1], [4], [3, 4, 5])
    elif per_expert <= 64:
        space = ([16, 32], [64, 128], [64, 128], [8], [4], [3, 4])
    else:
        space = ([64, 128], [64, 128], [64], [8], [4, 8], [3, 4])
    return [MoeGemmConfig(*values) for values in itertools.product(*space)]


def best_config(num_tokens: int, args) -> dict:
    """The fastest correct candidate at num_tokens, beside the built-in table's config."""
    moe_args = inputs(num_tokens, args)
    ref = fused_moe_reference(*moe_args).float()
    default = moe_gemm_config(num_tokens, args.top_k, args.experts, torch.bfloat16)
    timed = {}
    for cfg in [default, *candidates(num_tokens * args.top_k / args.experts)]:
        try:
            out = fused_moe_triton(*moe_args, config=cfg).float()
            if (out - ref).norm() / ref.norm() > 0.02:
                continue
            timed[cfg] = time_ms(lambda *a, c=cfg: fused_moe_triton(*a, config=c), moe_args,
                                 args.iters, graph=True)
        except Exception as exc:  # out of shared memory, say: skip the config
            print(f"{num_tokens} tokens, {cfg}: {type(exc).__name__}")
    best = min(timed, key=timed.get)
    return {"tokens": num_tokens, "best": best, "best ms": timed[best],
            "table ms": timed.get(default, math.nan),
            "table / best": timed.get(default, math.nan) / timed[best]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=TOKENS)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out-dir", default=str(SHIPPED_DIR))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = [best_config(n, args) for n in args.tokens]
    name = config_file_name(args.experts, 2 * args.inter, args.hidden, torch.bfloat16,
                            torch.cuda.get_device_name())
    save_tuned(Path(args.out_dir) / name, {r["tokens"]: r["best"] for r in rows},
               {"top_k": args.top_k, "iters": args.iters, "torch": torch.__version__})
    table = [{**r, "best": str(r["best"]).removeprefix("MoeGemmConfig")} for r in rows]
    print_table(table, f"Fused MoE tuning: E={args.experts}, top-{args.top_k}, hidden "
                f"{args.hidden}, expert width {args.inter}, bf16")
    print(f"tuned file: {Path(args.out_dir) / name}")
    save_json(args.json, {"args": vars(args), "file": name, "rows": table})


if __name__ == "__main__":
    main()
