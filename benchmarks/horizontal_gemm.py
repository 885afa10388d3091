"""Horizontal GEMM fusion (issue 14, item 1): decode tokens/s at batch 1, 8 and 32 with the fused
layer (q/k/v and gate/up as one matmul each: 4 per layer) against the unfused one (7 per layer,
`passes={"enable_horizontal_gemm": false}`), CUDA graphs on, async scheduling (the default),
each engine in its own process; the optional FP8 pair runs `quantization="fp8"`.

    python -m benchmarks.horizontal_gemm --checkpoint-dir /tmp/ckpt        # llama3-8b, qwen3-0.6b
    python -m benchmarks.horizontal_gemm --shape cpu-small --batch-sizes 1 --new-tokens 8
"""

from __future__ import annotations

from benchmarks.common import decode_pair_main, fused_pair_rows

OFF = {"enable_horizontal_gemm": False}


def run_shape(shape: str, args) -> list[dict]:
    """One row per batch size: fused and unfused tok/s and their ratio."""
    return fused_pair_rows(shape, args, OFF)


def main() -> None:
    decode_pair_main("horizontal_gemm", __doc__, "Horizontal GEMM fusion",
                     ["llama3-8b", "qwen3-0.6b"], run_shape, [1, 8, 32], 128, 256)


if __name__ == "__main__":
    main()
