"""Triton kernels of the fused MoE op: routing aligned to expert blocks, the grouped GEMM."""

from compiled_llm.moe.kernels.align import AlignedRouting, max_padded_rows, moe_align_block_size
from compiled_llm.moe.kernels.grouped_gemm import MoeGemmConfig, moe_gemm

__all__ = ["AlignedRouting", "MoeGemmConfig", "kernels_interpreted", "max_padded_rows",
           "moe_align_block_size", "moe_gemm"]


def kernels_interpreted() -> bool:
    """True when Triton's interpreter runs these kernels (TRITON_INTERPRET=1 at import)."""
    from triton.runtime.jit import JITFunction

    from compiled_llm.moe.kernels.grouped_gemm import _moe_gemm_kernel

    return not isinstance(_moe_gemm_kernel, JITFunction)
