"""The small-M GEMM's epilogues (issue 14): decode tokens/s at batch 1, 8 and 32 with both
(`SmallMGemmAddRMSNormFusionPass`, the default: the o and down projections' split-K sums add the
residual and normalize; `SmallMGemmSiluMulFusionPass`, opt-in: the gate/up GEMM makes the
SiLU·mul) against both off (`passes={"enable_small_m_silu_mul": false,
"enable_small_m_add_rms_norm": false}`), CUDA graphs on, async, each engine its own process.

    python -m benchmarks.small_m_epilogues --checkpoint-dir /tmp/ckpt --rounds 2
    python -m benchmarks.small_m_epilogues --shape cpu-small --batch-sizes 1 --new-tokens 8
"""

from __future__ import annotations

from benchmarks.common import decode_pair_main, fused_pair_rows

OFF = {"enable_small_m_silu_mul": False, "enable_small_m_add_rms_norm": False}
ON = {"enable_small_m_silu_mul": True, "enable_small_m_add_rms_norm": True}


def run_shape(shape: str, args) -> list[dict]:
    """One row per batch size: fused (both epilogues) and unfused tok/s and their ratio."""
    return fused_pair_rows(shape, args, OFF, ON)


def main() -> None:
    decode_pair_main("small_m_epilogues", __doc__, "Small-M GEMM epilogues",
                     ["qwen3-0.6b", "llama3-8b"], run_shape, [1, 8, 32], 128, 256)


if __name__ == "__main__":
    main()
