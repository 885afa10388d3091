"""Tune the W4A16 Triton kernels for Llama-3-8B's fused layer shapes (qkv, o, gate_up, down) at
decode and prefill token counts, and write the file the op reads (kernels/w4a16_tuning.py). Every
candidate (MMA tiles; up to 4 tokens the GEMV's block_n x block_k x split_k x warps x stages) is
checked against the torch reference, then timed as replays of one CUDA graph cycling through
enough weight copies to miss L2; bf16 `torch.mm` and tinygemm are timed the same way. Written:
each point's best tiles ("devices"; the best GEMV where it wins), up to 4 tokens which of the
GEMV, the MMA tiles and tinygemm wins ("small_m"), and tinygemm_max_rows: the largest token
count up to which tinygemm beats the MMA tiles on every shape. --quick times tinygemm, the
shipped and built-in tiles, bf16.

    python -m benchmarks.w4a16_tune --out compiled_llm/quantization/configs/w4a16.json
    python -m benchmarks.w4a16_tune --gemv-only --tokens 1 2 3 4   # GEMV against tinygemm
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
    SMS,
    W4A16Config,
    gemv_fits,
    w4a16_config,
    w4a16_gemm_triton,
    w4a16_gemv_config,
)
from compiled_llm.quantization.kernels.w4a16_tuning import lookup
from compiled_llm.quantization.packing import pack_int4
from compiled_llm.quantization.tinygemm import pack_tinygemm, tinygemm_mm, tinygemm_scales_zeros
from compiled_llm.quantization.w4a16 import w4a16_reference

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
GROUP = 128
SPLITS = (1, 2, 4, 8)


def gemv_candidates(m: int, n: int, k: int, args) -> list[W4A16Config]:
    """The GEMV tiles tried at m tokens: 4 to 16 packed words a thread (one to four 16-byte
    loads), at most 32 over all rows (more spilled at 4 tokens), K split only while the row
    blocks alone leave SMs idle."""
    if m > GEMV_MAX_ROWS:
        return []
    out = []
    for block_n, block_k, warps, stages, split in itertools.product(
            args.gemv_block_n, args.gemv_block_k, args.gemv_warps, args.gemv_stages, SPLITS):
        cfg = W4A16Config(m, block_n, block_k, split, warps, stages, gemv=True)
        words = block_n * block_k // 8 // (32 * warps)
        programs = -(-n // block_n)
        if (gemv_fits(cfg, m, k, GROUP) and 4 <= words <= 16 and words * m <= 32
                and k // block_k >= 2 * split and (split == 1 or programs < 2 * SMS)):
            out.append(cfg)
    return out


def mma_candidates(m: int) -> list[W4A16Config]:
    """The MMA kernel's tiles tried at m tokens (bf16 x: the paired dequantization, which
    ignores `expand`); up to 16 tokens also 128- and 256-row tiles on two warp groups."""
    if m <= 16:
        grid = [(block_n, split, stages, warps) for block_n, split, stages, warps
                in itertools.product([32, 64, 128, 256], [1, 2, 4, 8], [3, 4], [4, 8])
                if (warps == 4 and block_n < 256) or (warps == 8 and block_n >= 128)]
    elif m <= 64:
        grid = itertools.product([32, 64, 128], [1, 2, 4], [2, 3], [4])
    else:
        grid = itertools.product([64, 128], [1], [2, 3], [4])
    block_m = 16 if m <= 16 else 64
    return [W4A16Config(block_m, block_n, GROUP, split, warps, stages)
            for block_n, split, stages, warps in grid]


def candidates(m: int, n: int, k: int, args) -> list[W4A16Config]:
    """Every tile tried at one point: the built-in ones and the shipped entry first; with
    --quick nothing else, with --gemv-only no MMA search."""
    built_in_gemv = w4a16_gemv_config(m, n, k, GROUP) if m <= GEMV_MAX_ROWS else None
    tried = [w4a16_config(m, n, k, GROUP), built_in_gemv, lookup(args.gpu, m, n, k)]
    tried = [cfg for cfg in tried if cfg is not None]
    if not args.quick:
        tried += gemv_candidates(m, n, k, args)
        tried += [] if args.gemv_only and m <= GEMV_MAX_ROWS else mma_candidates(m)
    return list(dict.fromkeys(tried))


def weights(n: int, k: int, copies: int) -> list[tuple]:
    """`copies` random packed weights [n, k] with scales and zeros, on the GPU."""
    out = []
    for _ in range(copies):
        values = torch.randint(0, 16, (n, k), device="cuda", dtype=torch.uint8)
        scales = (torch.rand(n, k // GROUP, device="cuda") * 0.02 + 0.005).bfloat16()
        zeros = torch.randint(0, 16, (n, k // GROUP), device="cuda", dtype=torch.uint8)
        out.append((pack_int4(values), scales, zeros))
    return out


def tinygemm_weights(packed: list[tuple]) -> list[tuple]:
    """tinygemm's (packed weight, scales_zeros) of each copy, as prepare_tinygemm makes them."""
    return [(pack_tinygemm(qweight), tinygemm_scales_zeros(scales, zeros))
            for qweight, scales, zeros in packed]


def _wrong(out: torch.Tensor, ref: torch.Tensor) -> bool:
    return bool((out.float() - ref).norm() / ref.norm() > 1e-2)


def tinygemm_ms(x: torch.Tensor, ref: torch.Tensor, tiny: list[tuple]) -> float | None:
    """tinygemm's graph time on x, or None (with a line) if it is wrong or fails."""
    try:
        if _wrong(tinygemm_mm(x, *tiny[0], GROUP), ref):
            print(f"tinygemm m={x.shape[0]}: wrong result, skipped")
            return None
        return graph_ms(lambda i: tinygemm_mm(x, *tiny[i], GROUP), len(tiny))
    except RuntimeError as exc:  # no tinygemm on this GPU or build
        print(f"tinygemm m={x.shape[0]}: {type(exc).__name__}: {str(exc)[:120]}")
        return None


def time_configs(label: str, x: torch.Tensor, ref: torch.Tensor, packed: list[tuple],
                 configs: list[W4A16Config]) -> dict[W4A16Config, float]:
    """Graph ms of each correct config (a wrong or failing one skipped with a line)."""
    timed = {}
    for cfg in configs:
        try:
            if _wrong(w4a16_gemm_triton(x, *packed[0], GROUP, cfg), ref):
                print(f"{label} {cfg}: wrong result, skipped")
                continue
            timed[cfg] = graph_ms(lambda i, c=cfg: w4a16_gemm_triton(x, *packed[i], GROUP, c),
                                  len(packed))
        except Exception as exc:  # out of registers or shared memory, say: skip the config
            print(f"{label} {cfg}: {type(exc).__name__}: {str(exc)[:120]}")
    return timed


def _best(timed: dict[W4A16Config, float], gemv: bool) -> tuple[W4A16Config | None, float | None]:
    """The fastest config of one kernel (GEMV or MMA) and its ms, or (None, None)."""
    mine = {cfg: ms for cfg, ms in timed.items() if cfg.gemv == gemv}
    best = min(mine, key=mine.get, default=None)
    return best, mine.get(best)


def tune_point(name: str, m: int, packed: list[tuple], dense: list[torch.Tensor],
               tiny: list[tuple], args) -> dict:
    """One shape and token count: the best GEMV and MMA tiles, tinygemm, bf16 (ms) and the winner
    among the first three; "best", the fastest Triton tiles, is what the file's "devices" gets
    (the GEMV's wherever the GEMV wins)."""
    n, k = SHAPES[name]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    ref = w4a16_reference(x.float(), packed[0][0], packed[0][1].float(), packed[0][2], None,
                          None, GROUP)
    timed = time_configs(f"{name} m={m}", x, ref, packed, candidates(m, n, k, args))
    gemv, gemv_ms = _best(timed, gemv=True)
    _, mma_ms = _best(timed, gemv=False)
    tiny_ms = tinygemm_ms(x, ref, tiny)
    paths = {"gemv": gemv_ms, "tinygemm": tiny_ms, "mma": mma_ms}
    winner = min((path for path, ms in paths.items() if ms), key=paths.get)
    return {"shape": name, "m": m, "winner": winner, "best": min(timed, key=timed.get),
            "gemv": gemv,
            "gemv ms": gemv_ms, "tinygemm ms": tiny_ms, "mma ms": mma_ms,
            "bf16 ms": graph_ms(lambda i: torch.mm(x, dense[i % len(dense)].t()), len(dense)),
            "weight bytes": n * k // 2}


def table_row(row: dict) -> dict:
    """The printed columns: us, packed-weight GB/s, the winner."""
    def us(ms):
        return ms * 1e3 if ms else None

    def gbs(ms):
        return row["weight bytes"] / ms / 1e6 if ms else None

    return {"shape": row["shape"], "m": row["m"], "gemv us": us(row["gemv ms"]),
            "gemv GB/s": gbs(row["gemv ms"]), "tinygemm us": us(row["tinygemm ms"]),
            "tinygemm GB/s": gbs(row["tinygemm ms"]), "mma us": us(row["mma ms"]),
            "mma GB/s": gbs(row["mma ms"]), "bf16 us": us(row["bf16 ms"]),
            "winner": row["winner"], "gemv tile": _tile(row["gemv"])}


def _tile(cfg: W4A16Config | None) -> str:
    if cfg is None:
        return "-"
    return (f"n{cfg.block_n} k{cfg.block_k} s{cfg.split_k} w{cfg.num_warps} "
            f"st{cfg.num_stages}")


def tinygemm_rows(rows: list[dict]) -> int:
    """The largest measured token count up to which tinygemm beats the best MMA tiles on every
    shape measured (0 when it loses at the smallest); where the GEMV beats tinygemm, the file's
    small_m entry already sends those points to it."""
    best = 0
    for m in sorted({row["m"] for row in rows}):
        at_m = [row for row in rows if row["m"] == m]
        if not all(row["tinygemm ms"] and (row["mma ms"] is None or
                                           row["tinygemm ms"] < row["mma ms"]) for row in at_m):
            break
        best = m
    return best


def tune_shape(name: str, args, rows: list[dict], table: dict) -> None:
    """Every token count of one shape, appended to rows and (unless --quick) to the table."""
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
            table.setdefault(f"{n}x{k}", {})[str(m)] = row
        print({**table_row(row), "best": str(row["best"])}, flush=True)
    del packed, dense, tiny
    torch.cuda.empty_cache()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (parses on a machine without a GPU)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 16, 64, 256])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--out", default="compiled_llm/quantization/configs/w4a16.json")
    ap.add_argument("--gemv-only", action="store_true",
                    help="at up to 4 tokens search only the GEMV's tiles (beside the built-in "
                         "and shipped ones and tinygemm)")
    ap.add_argument("--gemv-block-n", type=int, nargs="+", default=[16, 32, 64, 128])
    ap.add_argument("--gemv-block-k", type=int, nargs="+", default=[128, 256, 512])
    ap.add_argument("--gemv-warps", type=int, nargs="+", default=[2, 4, 8])
    # the GEMV prefetches its next tile itself; Triton's pipeliner leaves its loads alone
    ap.add_argument("--gemv-stages", type=int, nargs="+", default=[1])
    ap.add_argument("--quick", action="store_true",
                    help="time only tinygemm, the shipped and built-in tiles and bf16; write "
                         "only the tinygemm threshold")
    ap.add_argument("--output-json", default=None)
    return ap.parse_args(argv)


def main() -> None:
    args = parse_args()
    args.gpu = torch.cuda.get_device_name()
    rows, table = [], {}
    start = time.perf_counter()
    for name in args.shapes:
        tune_shape(name, args, rows, table)
        write(args, table, rows, time.perf_counter() - start)
    print_table([table_row(r) for r in rows], f"W4A16 small-M paths on {args.gpu}")


def file_entries(table: dict) -> tuple[dict, dict]:
    """The file's "devices" and "small_m" entries of this run: per shape and token count the
    best tiles, and up to GEMV_MAX_ROWS tokens (where tinygemm was timed) the small-M winner."""
    devices, small_m = {}, {}
    for shape, by_m in table.items():
        for m, row in by_m.items():
            devices.setdefault(shape, {})[m] = dataclasses.asdict(row["best"])
            if int(m) <= GEMV_MAX_ROWS and row["tinygemm ms"] and (row["gemv ms"]
                                                                    or row["mma ms"]):
                choice = row["winner"]
                small_m.setdefault(shape, {})[m] = choice
    return devices, small_m


def write(args, table: dict, rows: list[dict], seconds: float) -> None:
    """The op's file (this GPU's tuned shapes and token counts replaced, the others kept) and
    the benchmark's JSON."""
    path = Path(args.out)
    payload = json.loads(path.read_text()) if path.is_file() else {"devices": {}}
    devices, small_m = file_entries(table)
    for key, entries in (("devices", devices), ("small_m", small_m)):
        shapes = payload.setdefault(key, {}).setdefault(args.gpu, {})
        for shape, by_m in entries.items():
            shapes.setdefault(shape, {}).update(by_m)
    if {row["shape"] for row in rows} == set(SHAPES):  # from every shape, not a subset
        payload.setdefault("tinygemm_max_rows", {})[args.gpu] = tinygemm_rows(rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1) + "\n")
    save_json(args.output_json, {"device": args.gpu, "seconds": seconds,
                                 "rows": [{**table_row(r), "best": str(r["best"])}
                                          for r in rows]})


if __name__ == "__main__":
    main()
