"""Small-M GEMMs (issue 14, item 3): decode tokens/s at batch 1, 8 and 32 with the tuned
`compiled_llm::small_m_mm` (the default: the Triton kernel where compiled_llm/gemm/configs holds
a win, cuBLAS elsewhere) against plain cuBLAS matmuls (`passes={"enable_small_m_gemm": false}`),
CUDA graphs on, async scheduling, each engine in its own process.

    python -m benchmarks.small_m_gemm --checkpoint-dir /tmp/ckpt      # llama3-8b, qwen3-0.6b
    python -m benchmarks.small_m_gemm --shape cpu-small --batch-sizes 1 --new-tokens 8
"""

from __future__ import annotations

from benchmarks.common import decode_pair_main, fused_pair_rows

OFF = {"enable_small_m_gemm": False}


def run_shape(shape: str, args) -> list[dict]:
    """One row per batch size: small-M op ("fused") and cuBLAS ("unfused") tok/s, ratio."""
    return fused_pair_rows(shape, args, OFF)


def main() -> None:
    decode_pair_main("small_m_gemm", __doc__, "Small-M GEMM (tuned Triton) against cuBLAS",
                     ["llama3-8b", "qwen3-0.6b"], run_shape, [1, 8, 32], 128, 256)


if __name__ == "__main__":
    main()
