"""`small_m_gemm_tune --gate-up`: tune the small-M kernel's GATE_UP epilogue, silu(x @ gate^T) *
(x @ up^T) from W = [gate; up], against what runs without it (the plain product with its tuned
entry or cuBLAS, then silu_mul_halves), timed alike; the winner goes under "gate_up:N,K" of the
same table (block_n: gate rows per program, as many up rows), "unfused" where it does not beat
the unfused path by --margin. Candidates: split_k 1 only (the epilogue needs whole products)."""

from __future__ import annotations

import dataclasses
import itertools

import torch
import torch.nn.functional as F

from benchmarks.small_m_gemm_tune import (
    SHAPES,
    _fits,
    _programs_ok,
    graph_us,
    refine,
    time_configs,
)
from compiled_llm.gemm.epilogue import silu_mul_halves
from compiled_llm.gemm.kernels import small_m_gate_up_silu_mul_triton, small_m_mm_triton
from compiled_llm.gemm.tuning import (
    GATE_UP,
    SHIPPED,
    UNFUSED,
    SmallMConfig,
    gate_up_from_plain,
    shape_key,
    tuned_entry,
)

GATE_UP_SHAPES = ("qwen3-0.6b.gate_up", "llama3-8b.gate_up", "tiny")
REFINED = 3  # coarse winners refined over warps and stages: two W tiles make them matter more


def gate_up_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """silu(x @ gate^T) * (x @ up^T) in float32, each product rounded to x's dtype first (the
    kernel wrapper's contract), the SiLU·mul as passes/ops.py silu_and_mul_ref writes it."""
    gate, up = torch.mm(x.float(), weight.float().t()).to(x.dtype).float().chunk(2, dim=-1)
    return F.silu(gate) * up


def fits_gate_up(m: int, cfg: SmallMConfig) -> bool:
    """_fits for a program holding block_n gate rows and as many up rows (two W tiles a step)."""
    return cfg.block_n >= (16 if cfg.use_dot else 1) and _fits(
        m, dataclasses.replace(cfg, block_n=2 * cfg.block_n))


def gate_up_coarse(m: int, half: int, k: int, sms: int, args) -> list[SmallMConfig]:
    """Gate rows (--block-n) x K tiles (--block-k) at 4 warps, 3 stages, no split-K: the MMA
    always, CUDA cores to 4 rows; --quick: the plain tuner's handful of small tiles."""
    quick = args.quick  # args, not GRID: under `python -m` the tuner's GRID is __main__'s copy
    block_ns, block_ks = ([16, 32], [32, 64]) if quick else (args.block_n, args.block_k)
    out = []
    for block_n, block_k, dot in itertools.product(block_ns, block_ks, [False, True]):
        cfg = SmallMConfig(block_n, block_k, 1, 4, 3, dot)
        if (dot or m <= 4) and fits_gate_up(m, cfg) and (
                quick or _programs_ok(half, k, cfg, sms)):
            out.append(cfg)
    return out


def plain_entry(args, m: int, n: int, k: int) -> SmallMConfig | None:
    """The plain product's entry the unfused path takes (None: cuBLAS), read as the op reads it
    from the table being written (--out), then the shipped one."""
    entry = tuned_entry(args.gpu, m, n, k, paths=(args.out, str(SHIPPED)))
    return entry if isinstance(entry, SmallMConfig) else None


def unfused_call(x: torch.Tensor, weights: list[torch.Tensor], plain: SmallMConfig | None):
    """call(i): the op's unfused path on weights[i], the product (plain's kernel or cuBLAS) then
    silu_mul_halves."""
    def call(i: int) -> torch.Tensor:
        weight = weights[i]
        product = torch.mm(x, weight.t()) if plain is None else small_m_mm_triton(x, weight, plain)
        return silu_mul_halves(product)

    return call


def tune_gate_up_point(name: str, m: int, weights: list[torch.Tensor], args, sms: int,
                       refining: bool) -> dict:
    """The unfused path, the epilogue as the op takes it without an entry, and the best correct
    epilogue config for one gate_up shape and token count; the entry: that config or UNFUSED."""
    n, k = SHAPES[name]
    x = torch.randn(m, k, device=weights[0].device, dtype=weights[0].dtype)
    ref = gate_up_reference(x, weights[0])
    label = f"{name} gate_up m={m}"
    plain = plain_entry(args, m, n, k)
    today = gate_up_from_plain(plain)  # what the op runs without a gate_up entry
    candidates = gate_up_coarse(m, n // 2, k, sms, args)
    candidates += [today] if today is not None and today not in candidates else []
    run = small_m_gate_up_silu_mul_triton
    timed = time_configs(x, weights, ref, candidates, label, run=run)
    top = sorted(timed, key=timed.get)[:REFINED] if refining else []
    timed.update(time_configs(x, weights, ref, refine(m, top, args.quick, fits_gate_up), label,
                              run=run))
    unfused_us = graph_us(unfused_call(x, weights, plain), len(weights))
    best = min(timed, key=timed.get) if timed else None
    best_us = timed[best] if best else float("inf")
    choice = best if best and best_us < unfused_us * (1 - args.margin) else UNFUSED
    return {"shape": name, "N,K": shape_key(n, k), "table key": shape_key(n, k, GATE_UP), "m": m,
            "plain": plain or "cublas", "unfused us": unfused_us,
            "today us": timed.get(today),  # None: no split-K-free plain config, or it failed
            "epilogue us": best_us, "unfused / epilogue": unfused_us / best_us,
            "candidates": len(timed), "choice": "unfused" if choice == UNFUSED else "epilogue",
            "config": best, "entry": choice}
