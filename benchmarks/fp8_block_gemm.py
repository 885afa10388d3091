"""Block-FP8 GEMMs alone (issue 19): the Triton kernel of compiled_llm::fp8_block_gemm against
`torch._scaled_mm` with block scales (activations 1x128; weights 128x128 or 1x128 per row), at
Llama-3-8B's fused-layer shapes, with bf16 `torch.mm` beside. Each variant is timed replayed in
one CUDA graph over enough weight copies to miss L2, and checked against the float32 reference.

    python -m benchmarks.fp8_block_gemm --json out.json
"""

from __future__ import annotations

import argparse
import functools
import math

import torch

from benchmarks.common import graph_ms, print_table, save_json

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
          "down": (4096, 14336)}


def block_weight(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A random e4m3 weight [N, K] and its 128x128 block scales [N/128, K/128]."""
    weight = (torch.randn(n, k, device="cuda") * 0.5).to(torch.float8_e4m3fn)
    return weight, torch.rand(n // 128, k // 128, device="cuda") * 0.01 + 0.001


@functools.cache
def _compiled(fn):
    torch._dynamo.config.cache_size_limit = 64  # one graph per (tokens, K)
    return torch.compile(fn, fullgraph=True, dynamic=False)


def variants(x, weight, blocks):
    """name -> call(x) for each path; the weight's per-row scales expanded as the engine keeps
    them ([N, K/128])."""
    from compiled_llm.quantization.fp8_groups import quant_fp8_groups
    from compiled_llm.quantization.kernels.fp8_block import fp8_block_gemm_triton

    rows = blocks.repeat_interleave(128, dim=0).contiguous()  # [N, K/128]
    quant = _compiled(quant_fp8_groups)

    def scaled(scale_b, a_major=False):
        def call(inp):
            x_q, x_s = quant(inp)
            x_s = x_s.t().contiguous().t() if a_major else x_s
            return torch._scaled_mm(x_q, weight.t(), scale_a=x_s, scale_b=scale_b,
                                    out_dtype=torch.bfloat16)
        return call

    return {
        "triton kernel": lambda inp: fp8_block_gemm_triton(inp, weight, rows),
        "quant alone (compiled)": lambda inp: quant(inp)[0],
        "scaled_mm 1x128/128x128": scaled(blocks.t()),
        "scaled_mm 1x128/128x128, scales contiguous": scaled(blocks.t().contiguous()),
        "scaled_mm 1x128/128x128, a M-major": scaled(blocks.t(), a_major=True),
        "scaled_mm 1x128/1x128": scaled(rows.t()),
        "scaled_mm 1x128/1x128, a M-major": scaled(rows.t(), a_major=True),
    }


def reference(x, weight, blocks):
    from compiled_llm.quantization.w8a8 import fp8_block_reference

    rows = blocks.repeat_interleave(128, dim=0)
    return fp8_block_reference(x, weight, rows, None).float()


def shape_rows(name: str, n: int, k: int, tokens: list[int]) -> list[dict]:
    """One row per (token count, variant): us a call and the error against the reference."""
    copies = max(1, math.ceil(200e6 / (n * k)))
    weights = [block_weight(n, k) for _ in range(copies)]
    dense = [(w.float() * 0.01).to(torch.bfloat16) for w, _ in weights]
    out = []
    for m in tokens:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        bf16_us = 1e3 * graph_ms(lambda i, x=x: x @ dense[i].t(), copies)
        ref = reference(x, *weights[0])
        calls = [variants(x, w, b) for w, b in weights]
        for label in calls[0]:
            row = {"shape": name, "N x K": f"{n}x{k}", "tokens": m, "variant": label,
                   "us": None, "x bf16 mm": None, "max rel err": None, "error": None}
            try:
                got = calls[0][label](x)
                if got.dtype != torch.float8_e4m3fn:
                    row["max rel err"] = float((got.float() - ref).abs().max()
                                               / ref.abs().max())
                timed = [call[label] for call in calls]
                row["us"] = 1e3 * graph_ms(lambda i, x=x, timed=timed: timed[i](x), copies)
                row["x bf16 mm"] = bf16_us / row["us"]
            except Exception as exc:  # a variant the build lacks: say why, keep the others
                row["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
            out.append(row)
        out.append({"shape": name, "N x K": f"{n}x{k}", "tokens": m, "variant": "bf16 mm",
                    "us": bf16_us, "x bf16 mm": 1.0, "max rel err": None, "error": None})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", nargs="+", type=int, default=[1, 16, 64, 256, 2048, 8192])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    for name in args.shapes:
        rows += shape_rows(name, *SHAPES[name], args.tokens)
        save_json(args.json, {"device": torch.cuda.get_device_name(), "rows": rows})
    print_table(rows, f"block-FP8 GEMMs on {torch.cuda.get_device_name()}")


if __name__ == "__main__":
    main()
