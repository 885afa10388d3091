"""The residual add + RMSNorm in the small-M GEMM's split-K sum (issue 14): decode tokens/s at
batch 1, 8 and 32 with `SmallMGemmAddRMSNormFusionPass` (the default: the o and down projections'
split-K sums add the residual and normalize) against it off (`passes={
"enable_small_m_add_rms_norm": false}`: Inductor's add + norm kernel after the sum), CUDA
graphs on, async scheduling, each engine in its own process.

    python -m benchmarks.small_m_add_rms_norm --checkpoint-dir /tmp/ckpt --rounds 2
    python -m benchmarks.small_m_add_rms_norm --shape cpu-small --batch-sizes 1 --new-tokens 8
"""

from __future__ import annotations

from benchmarks.common import decode_pair_main, fused_pair_rows

OFF = {"enable_small_m_add_rms_norm": False}


def run_shape(shape: str, args) -> list[dict]:
    """One row per batch size: fused (the defaults) and unfused tok/s and their ratio."""
    return fused_pair_rows(shape, args, OFF)


def main() -> None:
    decode_pair_main("small_m_add_rms_norm", __doc__, "Small-M GEMM + add + RMSNorm",
                     ["qwen3-0.6b", "llama3-8b"], run_shape, [1, 8, 32], 128, 256)


if __name__ == "__main__":
    main()
