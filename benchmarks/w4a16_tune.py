"""Tune the W4A16 Triton kernel's tiles for Llama-3-8B's fused layer shapes (qkv, o, gate_up,
down) at decode and prefill token counts, and write the file the kernel reads
(kernels/w4a16_tuning.py). Every candidate is checked against the torch reference, then timed
as replays of one CUDA graph whose calls cycle through enough weight copies to miss L2 (device
time, as in a captured step); bf16 `torch.mm` and torch's tinygemm int4 kernel on the same shapes
are timed the same way, and the file's tinygemm_max_rows for this GPU is set to the largest token
count up to which tinygemm beats the Triton kernel on every shape. --quick times only tinygemm,
the shipped tiles and bf16 (no tile search; about a minute for m in 1 4 16 64).

    python -m benchmarks.w4a16_tune --out compiled_llm/quantization/configs/w4a16.json
    python -m benchmarks.w4a16_tune --quick --tokens 1 4 16 64
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
from compiled_llm.quantization.kernels.w4a16 import (
    GEMV_MAX_ROWS,
    W4A16Config,
    w4a16_config,
    w4a16_gemm_triton,
)
from compiled_llm.quantization.kernels.w4a16_tuning import lookup, tinygemm_max_rows
from compiled_llm.quantization.packing import pack_int4
from compiled_llm.quantization.tinygemm import pack_tinygemm, tinygemm_mm, tinygemm_scales_zeros
from compiled_llm.quantization.w4a16 import w4a16_reference

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
GROUP = 128


def candidates(m: int, gemv_only: bool = False) -> list[W4A16Config]:
    """The tiles tried at m tokens: a narrow token side, K splits for decode; the GEMV variant
    too up to GEMV_MAX_ROWS rows (alone with gemv_only)."""
    gemv = [W4A16Config(m, block_n, block_k, split, gemv=True)
            for block_n, block_k, split in itertools.product([32, 64, 128], [128, 256],
                                                             [1, 2, 4, 8])
            ] if m <= GEMV_MAX_ROWS else []
    return gemv if gemv_only else gemv + mma_candidates(m)


def mma_candidates(m: int) -> list[W4A16Config]:
    """The MMA kernel's tiles tried at m tokens."""
    block_m = 16 if m <= 16 else 64
    if m <= 16:
        grid = itertools.product([16, 32, 64, 128], [1, 2, 4, 8], [False, True], [2, 4])
    elif m <= 64:
        grid = itertools.product([32, 64, 128], [1, 2, 4], [False, True], [2, 3])
    else:
        grid = itertools.product([64, 128], [1], [False, True], [2, 3])
    return [W4A16Config(block_m, block_n, GROUP, split, num_stages=stages, expand=expand)
            for block_n, split, expand, stages in grid]


def weights(n: int, k: int, copies: int) -> list[tuple]:
    """`copies` random packed weights [n, k] with scales and zeros, on the GPU."""
    out = []
    for _ in range(copies):
        values = torch.randint(0, 16, (n, k), device="cuda", dtype=torch.uint8)
        scales = (torch.rand(n, k // GROUP, device="cuda") * 0.02 + 0.005).bfloat16()
        zeros = torch.full((n, k // GROUP), 8, device="cuda", dtype=torch.uint8)
        out.append((pack_int4(values), scales, zeros))
    return out


def tinygemm_weights(packed: list[tuple]) -> list[tuple]:
    """tinygemm's (packed weight, scales_zeros) of each copy, as prepare_tinygemm makes them."""
    return [(pack_tinygemm(qweight), tinygemm_scales_zeros(scales, zeros))
            for qweight, scales, zeros in packed]


def tinygemm_ms(x: torch.Tensor, ref: torch.Tensor, tiny: list[tuple]) -> float | None:
    """tinygemm's graph time on x, or None (with a line) if it is wrong or fails."""
    try:
        out = tinygemm_mm(x, *tiny[0], GROUP).float()
        if (out - ref).norm() / ref.norm() > 1e-2:
            print(f"tinygemm m={x.shape[0]}: wrong result, skipped")
            return None
        return graph_ms(lambda i: tinygemm_mm(x, *tiny[i], GROUP), len(tiny))
    except RuntimeError as exc:  # no tinygemm on this GPU or build
        print(f"tinygemm m={x.shape[0]}: {type(exc).__name__}: {str(exc)[:120]}")
        return None


def tune_point(name: str, m: int, packed: list[tuple], dense: list[torch.Tensor],
               tiny: list[tuple], args) -> dict:
    """The fastest correct candidate for one shape and token count, beside bf16, tinygemm, the
    built-in tiles and the shipped file's entry (kept when nothing beats it); with args.quick
    only the shipped entry (else the built-in tiles) is tried."""
    n, k = SHAPES[name]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    ref = w4a16_reference(x.float(), *packed[0], None, None, GROUP)
    copies = len(packed)
    timed = {}
    built_in = w4a16_config(m, n, k, GROUP)
    shipped = lookup(torch.cuda.get_device_name(), m, n, k)
    tried = [shipped or built_in] if args.quick else [
        built_in, *([shipped] if shipped else []), *candidates(m, args.gemv_only)]
    for cfg in dict.fromkeys(tried):
        try:
            out = w4a16_gemm_triton(x, *packed[0], GROUP, cfg).float()
            if (out - ref).norm() / ref.norm() > 1e-2:
                print(f"{name} m={m} {cfg}: wrong result, skipped")
                continue
            timed[cfg] = graph_ms(lambda i, c=cfg: w4a16_gemm_triton(x, *packed[i], GROUP, c),
                                  copies)
        except Exception as exc:  # out of shared memory, say: skip the config
            print(f"{name} m={m} {cfg}: {type(exc).__name__}")
    bf16 = graph_ms(lambda i: torch.mm(x, dense[i % len(dense)].t()), len(dense))
    tiny_ms = tinygemm_ms(x, ref, tiny)
    best = min(timed, key=timed.get)
    weight_bytes = n * k // 2
    shipped_path = "tinygemm" if tiny_ms and m <= tinygemm_max_rows(
        torch.cuda.get_device_name()) else "triton"
    return {"shape": name, "m": m, "best": best, "best ms": timed[best],
            "built-in ms": timed.get(built_in), "shipped ms": timed.get(shipped),
            "tinygemm ms": tiny_ms, "bf16 mm ms": bf16, "bf16 / best": bf16 / timed[best],
            "bf16 / tinygemm": bf16 / tiny_ms if tiny_ms else None,
            "shipped path": shipped_path, "best GB/s": weight_bytes / timed[best] / 1e6,
            "tinygemm GB/s": weight_bytes / tiny_ms / 1e6 if tiny_ms else None}


def tinygemm_rows(rows: list[dict]) -> int:
    """The largest measured token count up to which tinygemm beats the best Triton tiles on
    every shape measured (0 when it loses at the smallest)."""
    best = 0
    for m in sorted({row["m"] for row in rows}):
        at_m = [row for row in rows if row["m"] == m]
        if not all(row["tinygemm ms"] and row["tinygemm ms"] < row["best ms"] for row in at_m):
            break
        best = m
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--out", default="compiled_llm/quantization/configs/w4a16.json")
    ap.add_argument("--gemv-only", action="store_true",
                    help="at up to 4 tokens try only the GEMV variant (beside the shipped entry)")
    ap.add_argument("--quick", action="store_true",
                    help="time only tinygemm, the shipped tiles and bf16; write only the "
                         "tinygemm threshold")
    ap.add_argument("--output-json", default=None)
    args = ap.parse_args()
    gpu, rows, table = torch.cuda.get_device_name(), [], {}
    start = time.perf_counter()
    for name in args.shapes:
        n, k = SHAPES[name]
        copies = max(2, -(-256 * 2**20 // (n * k // 2)))  # 256 MiB of weights: past L2
        packed = weights(n, k, copies)
        tiny = tinygemm_weights(packed)
        dense = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
                 for _ in range(max(2, copies // 4))]
        for m in args.tokens:
            row = tune_point(name, m, packed, dense, tiny, args)
            rows.append(row)
            if not args.quick:
                table.setdefault(f"{n}x{k}", {})[str(m)] = dataclasses.asdict(row["best"])
            print(row, flush=True)
        del packed, dense, tiny
        torch.cuda.empty_cache()
        write(args, gpu, table, rows, time.perf_counter() - start)
    print_table([{**r, "best": str(r["best"])} for r in rows], f"W4A16 tiles on {gpu}")


def write(args, gpu: str, table: dict, rows: list[dict], seconds: float) -> None:
    """The kernel's file (this GPU's tuned shapes and token counts replaced, the others kept)
    and the benchmark's JSON."""
    path = Path(args.out)
    payload = json.loads(path.read_text()) if path.is_file() else {"devices": {}}
    shapes = payload["devices"].setdefault(gpu, {})
    for shape, by_m in table.items():
        shapes.setdefault(shape, {}).update(by_m)
    if {row["shape"] for row in rows} == set(SHAPES):  # from every shape, not a subset
        payload.setdefault("tinygemm_max_rows", {})[gpu] = tinygemm_rows(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1) + "\n")
    save_json(args.output_json, {"device": gpu, "seconds": seconds,
                                 "rows": [{**r, "best": str(r["best"])} for r in rows]})


if __name__ == "__main__":
    main()
