"""Tune the small-M GEMM kernel (compiled_llm/gemm) against cuBLAS for Qwen3-0.6B's and
Llama-3-8B's decode GEMMs (fused qkv, o, gate_up, down; lm_head) at 1-16 tokens, and write the
table `compiled_llm::small_m_mm` reads: {"devices": {GPU: {"N,K": {M: config | "cublas"}}}}.
Each candidate is checked against torch.mm, then timed as replays of one CUDA graph of 24 calls
cycling through enough weight copies to miss L2. A coarse search over tiles and K splits (4 warps,
3 stages) is refined over warps and stages for its best two. Triton wins an entry only when
faster than cuBLAS by --margin. Past 70% of --max-seconds the refinement is skipped (Triton's
compiles dominate a cold run; its disk cache makes a second run fast). --gate-up tunes the
GATE_UP epilogue of the gate_up shapes instead (small_m_gate_up_tune.py), against the product +
SiLU·mul kernel, into "gate_up:N,K" keys of the same table.

    python -m benchmarks.small_m_gemm_tune --out compiled_llm/gemm/configs/small_m_gemm.json
    python -m benchmarks.small_m_gemm_tune --gate-up --shapes qwen3-0.6b.gate_up
    TRITON_INTERPRET=1 python -m benchmarks.small_m_gemm_tune --quick --shapes tiny \
        --out /tmp/small_m.json
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import time
from pathlib import Path

import torch

from benchmarks.common import graph_ms, print_table, save_json
from compiled_llm.gemm.kernels import small_m_mm_triton
from compiled_llm.gemm.tuning import CUBLAS, SmallMConfig, shape_key

SHAPES = {
    "qwen3-0.6b.qkv": (4096, 1024), "qwen3-0.6b.o": (1024, 2048),
    "qwen3-0.6b.gate_up": (6144, 1024), "qwen3-0.6b.down": (1024, 3072),
    "llama3-8b.qkv": (6144, 4096), "llama3-8b.o": (4096, 4096),
    "llama3-8b.gate_up": (28672, 4096), "llama3-8b.down": (4096, 14336),
    "qwen3-0.6b.lm_head": (151936, 1024), "llama3-8b.lm_head": (128256, 4096),
    "tiny": (96, 320),  # the CPU check under TRITON_INTERPRET=1
}
DEFAULT_SHAPES = [name for name in SHAPES if name != "tiny"]
ITERS = 24  # calls per graph replay
L2_BYTES = 128 << 20  # weight bytes cycled through per shape: well past an H200's 60 MB of L2
MAX_SMEM = 160 << 10  # bytes of W tiles in flight per program (stages x tile)


def _programs_ok(n: int, k: int, cfg: SmallMConfig, sms: int) -> bool:
    """Enough programs to fill the GPU, not so many that K splits are tiny or empty."""
    programs = -(-n // cfg.block_n) * cfg.split_k
    k_tiles = -(-k // cfg.block_k)
    return (cfg.split_k == 1 or k_tiles >= 2 * cfg.split_k) and (
        programs >= sms or cfg.split_k == 1) and programs <= 64 * sms


def _fits(m: int, cfg: SmallMConfig) -> bool:
    """Registers and shared memory: the CUDA-core variant holds [M, BN, BK] products."""
    if cfg.use_dot:
        return cfg.block_n >= 16 and cfg.block_n * cfg.block_k * 2 * cfg.num_stages <= MAX_SMEM
    rows = 1 << (m - 1).bit_length()
    return rows * cfg.block_n * cfg.block_k <= 4096 * cfg.num_warps


GRID = [[8, 16, 32, 64], [128, 256, 512], [1, 2, 4, 8]]  # block_n, block_k, split_k


def coarse(m: int, n: int, k: int, sms: int, quick: bool) -> list[SmallMConfig]:
    """Tiles and K splits at 4 warps, 3 stages: the MMA variant always, CUDA cores to 4 rows."""
    block_ns, block_ks, splits = ([16, 32], [32, 64], [1, 2]) if quick else GRID
    out = []
    for block_n, block_k, split, dot in itertools.product(block_ns, block_ks, splits,
                                                          [False, True]):
        if not dot and m > 4:
            continue
        cfg = SmallMConfig(block_n, block_k, split, 4, 3, dot)
        if _fits(m, cfg) and (quick or _programs_ok(n, k, cfg, sms)):
            out.append(cfg)
    return out


def refine(m: int, best: list[SmallMConfig], quick: bool, fits=_fits) -> list[SmallMConfig]:
    """Warps {4, 8} x stages {2, 3, 4} around each of the best coarse configs that fit."""
    if quick:
        return []
    out = [dataclasses.replace(cfg, num_warps=warps, num_stages=stages)
           for cfg in best for warps, stages in itertools.product([4, 8], [2, 3, 4])]
    return [cfg for cfg in dict.fromkeys(out) if cfg not in best and fits(m, cfg)]


def graph_us(call, copies: int) -> float:
    """Mean us of call(i) replayed in one CUDA graph (benchmarks.common.graph_ms); on the CPU
    (the interpreter check) plain wall time of two eager calls."""
    if torch.cuda.is_available():
        return graph_ms(call, copies, ITERS) * 1e3
    call(0)
    start = time.perf_counter()
    for i in range(2):
        call(i % copies)
    return (time.perf_counter() - start) / 2 * 1e6


def time_configs(x: torch.Tensor, weights: list[torch.Tensor], ref: torch.Tensor,
                 configs: list[SmallMConfig], label: str,
                 run=small_m_mm_triton) -> dict[SmallMConfig, float]:
    """us per call of run(x, weight, config) for each config that compiles and matches ref
    (torch.mm's product for the plain kernel)."""
    timed = {}
    for cfg in configs:
        try:
            out = run(x, weights[0], cfg).float()
            err = ((out - ref).norm() / ref.norm()).item()
            if err > 1e-2:
                print(f"{label} {cfg}: wrong result (rel err {err:.3g}), skipped")
                continue
            timed[cfg] = graph_us(lambda i, c=cfg: run(x, weights[i], c), len(weights))
        except Exception as exc:  # out of resources, say: skip the config
            print(f"{label} {cfg}: {type(exc).__name__}: {str(exc)[:100]}")
    return timed


def tune_point(name: str, m: int, weights: list[torch.Tensor], args, sms: int,
               refining: bool) -> dict:
    """cuBLAS and the best correct Triton config for one shape and token count."""
    n, k = SHAPES[name]
    x = torch.randn(m, k, device=weights[0].device, dtype=weights[0].dtype)
    ref = torch.mm(x.float(), weights[0].float().t())
    label = f"{name} m={m}"
    timed = time_configs(x, weights, ref, coarse(m, n, k, sms, args.quick), label)
    top = sorted(timed, key=timed.get)[:2] if refining else []
    timed.update(time_configs(x, weights, ref, refine(m, top, args.quick), label))
    cublas = graph_us(lambda i: torch.mm(x, weights[i].t()), len(weights))
    best = min(timed, key=timed.get) if timed else None
    best_us = timed[best] if best else float("inf")
    choice = best if best and best_us < cublas * (1 - args.margin) else CUBLAS
    tbps = lambda us: n * k * weights[0].element_size() / us / 1e6  # noqa: E731
    return {"shape": name, "N,K": shape_key(n, k), "m": m, "cublas us": cublas,
            "cublas TB/s": tbps(cublas), "triton us": best_us,
            "triton TB/s": tbps(best_us) if best else 0.0, "cublas / triton": cublas / best_us,
            "candidates": len(timed), "choice": "cublas" if choice == CUBLAS else "triton",
            "config": best, "entry": choice}


def shape_weights(name: str, device: str, dtype: torch.dtype) -> list[torch.Tensor]:
    """Random weight copies of one shape, L2_BYTES of them (2 at least)."""
    n, k = SHAPES[name]
    copies = max(2, -(-L2_BYTES // (n * k * torch.finfo(dtype).bits // 8)))
    return [torch.randn(n, k, device=device, dtype=dtype) / k**0.5 for _ in range(copies)]


def write_table(path: Path, gpu: str, rows: list[dict]) -> None:
    """This GPU's entries of the tuned keys ("N,K", or a row's "table key") and token counts
    replaced, the others kept."""
    payload = json.loads(path.read_text()) if path.is_file() else {"devices": {}}
    shapes = payload.setdefault("devices", {}).setdefault(gpu, {})
    for row in rows:
        entry = row["entry"]  # a config, or a marker: "cublas", "unfused"
        shapes.setdefault(row.get("table key", row["N,K"]), {})[str(row["m"])] = (
            entry if isinstance(entry, str) else dataclasses.asdict(entry))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1) + "\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; --gate-up defaults --shapes to the gate_up shapes and checks them."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=None, choices=list(SHAPES))
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--out", default="compiled_llm/gemm/configs/small_m_gemm.json")
    ap.add_argument("--margin", type=float, default=0.03,
                    help="Triton must beat cuBLAS (--gate-up: the unfused path) by this fraction "
                         "to take an entry")
    ap.add_argument("--gate-up", action="store_true",
                    help="tune the GATE_UP epilogue against the product + SiLU·mul kernel "
                         "(benchmarks/small_m_gate_up_tune.py)")
    ap.add_argument("--quick", action="store_true",
                    help="a handful of small tiles, no refinement (the CPU interpreter check)")
    ap.add_argument("--max-seconds", type=float, default=230.0,
                    help="time budget: refinement stops at 70%% of it")
    ap.add_argument("--block-n", type=int, nargs="+", default=GRID[0],
                    help="W rows per program (--gate-up: gate rows, as many up rows)")
    ap.add_argument("--block-k", type=int, nargs="+", default=GRID[1])
    ap.add_argument("--split-k", type=int, nargs="+", default=GRID[2],
                    help="ignored by --gate-up: the epilogue needs whole products")
    ap.add_argument("--output-json", default=None)
    args = ap.parse_args(argv)
    if args.gate_up:
        from benchmarks.small_m_gate_up_tune import GATE_UP_SHAPES

        args.shapes = args.shapes or [name for name in GATE_UP_SHAPES if name != "tiny"]
        if set(args.shapes) - set(GATE_UP_SHAPES):
            ap.error(f"--gate-up tunes {', '.join(GATE_UP_SHAPES)}")
    args.shapes = args.shapes or DEFAULT_SHAPES
    return args


def main(argv: list[str] | None = None) -> None:
    """Tune every requested shape and token count, write the table after each shape."""
    args = parse_args(argv)
    GRID[:] = [args.block_n, args.block_k, args.split_k]
    on_gpu = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if on_gpu else ("cpu", torch.float32)
    args.gpu = torch.cuda.get_device_name() if on_gpu else "cpu-interpreter"
    sms = torch.cuda.get_device_properties(0).multi_processor_count if on_gpu else 1
    point = tune_point
    if args.gate_up:
        from benchmarks.small_m_gate_up_tune import tune_gate_up_point as point
    rows, start = [], time.perf_counter()
    for name in args.shapes:
        weights = shape_weights(name, device, dtype)
        for m in args.tokens:
            refining = time.perf_counter() - start < 0.7 * args.max_seconds
            rows.append(point(name, m, weights, args, sms, refining))
            print({key: value for key, value in rows[-1].items() if key != "entry"}, flush=True)
        del weights
        if on_gpu:
            torch.cuda.empty_cache()
        write_table(Path(args.out), args.gpu, rows)
    seconds = time.perf_counter() - start
    shown = [{key: str(value) if key in ("config", "plain") else value
              for key, value in row.items() if key != "entry"} for row in rows]
    kind = "GATE_UP epilogue vs product + SiLU·mul" if args.gate_up else "GEMM"
    print_table(shown, f"small-M {kind} on {args.gpu} ({dtype}), {seconds:.0f} s")
    save_json(args.output_json, {"device": args.gpu, "seconds": seconds, "gate_up": args.gate_up,
                                 "rows": shown})


if __name__ == "__main__":
    main()
