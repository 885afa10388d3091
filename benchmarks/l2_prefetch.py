"""The L2 weight prefetch (compiled_llm/gemm/prefetch.py) in isolation: one decode layer's
attention stands in as a spin kernel of --idle-us microseconds that reads no memory, then the
o projection's GEMM (`compiled_llm::small_m_mm`, as the engine runs it) at 1 token; with the
prefetch launched before the spin, at several L2 fractions, against none. CUDA-graph replays
cycling through weight copies that miss L2 (benchmarks.common.graph_ms); µs per layer.

    python -m benchmarks.l2_prefetch --json /tmp/l2_prefetch.json
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.common import graph_ms, print_table, save_json
from compiled_llm.gemm import l2_prefetch, small_m_mm

SHAPES = {"llama3-8b.o": (4096, 4096), "llama3-8b.down": (4096, 14336),
          "qwen3-0.6b.o": (1024, 2048), "llama3-8b.qkv": (6144, 4096)}
COPY_BYTES = 256 << 20  # weight bytes cycled through per shape: past any GPU's L2


def spin_cycles(idle_us: float) -> int:
    """Clock cycles of torch.cuda._sleep that take about idle_us on this GPU (timed once)."""
    probe = 10_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(probe)
    start.record()
    torch.cuda._sleep(probe)
    end.record()
    torch.cuda.synchronize()
    return int(idle_us * probe / (1e3 * start.elapsed_time(end)))


def layer_us(weights, x, idle_us: float, fraction: float | None) -> float:
    """µs of [prefetch] + spin + GEMM per layer, each layer its own weight copy."""
    cycles = spin_cycles(idle_us)

    def call(i: int) -> None:
        if fraction is not None:
            l2_prefetch(weights[i], x, fraction)
        if cycles:
            torch.cuda._sleep(cycles)
        small_m_mm(x, weights[i])

    return 1e3 * graph_ms(call, len(weights))


def shape_rows(name: str, args) -> list[dict]:
    n, k = SHAPES[name]
    copies = max(2, COPY_BYTES // (n * k * 2))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    rows = []
    for idle in args.idle_us:
        base = layer_us(weights, x, idle, None)
        row = {"shape": name, "MB": n * k * 2 / 1e6, "idle µs": idle, "none µs": base}
        for fraction in args.fractions:
            row[f"{fraction:g} L2 µs"] = layer_us(weights, x, idle, fraction)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--idle-us", nargs="+", type=float, default=[0.0, 5.0, 10.0])
    ap.add_argument("--fractions", nargs="+", type=float, default=[0.25, 0.5, 0.75, 1.0])
    ap.add_argument("--json")
    args = ap.parse_args()
    l2_mb = torch.cuda.get_device_properties(0).L2_cache_size / 1e6
    rows = [row for name in args.shapes for row in shape_rows(name, args)]
    print_table(rows, f"L2 prefetch before an idle spin and the GEMM, 1 token, "
                f"{torch.cuda.get_device_name()} (L2 {l2_mb:.0f} MB); µs per layer")
    save_json(args.json, {"device": torch.cuda.get_device_name(), "l2_mb": l2_mb,
                          "rows": rows})


if __name__ == "__main__":
    main()
