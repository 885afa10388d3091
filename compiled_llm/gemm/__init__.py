"""Dense GEMMs of few tokens (decode): the `compiled_llm::small_m_mm` op (ops.py), its Triton
split-K kernel (kernels.py), the tuned choice of it or cuBLAS per GPU and shape (tuning.py,
configs/small_m_gemm.json), fused variants with a prologue or epilogue (epilogue.py, prologue.py),
each put in the graph by its pass (passes/small_m_*.py, silu_mul_small_m.py); and the L2 weight
prefetch before attention (prefetch.py, passes/l2_weight_prefetch.py)."""

from compiled_llm.gemm.ops import (
    small_m_gate_up_silu_mul,
    small_m_mm,
    small_m_mm_add_rms_norm,
    small_m_mm_add_rms_norm_mm,
    small_m_mm_silu_mul,
)
from compiled_llm.gemm.prefetch import l2_prefetch
from compiled_llm.gemm.tuning import SmallMConfig

__all__ = ["SmallMConfig", "l2_prefetch", "small_m_gate_up_silu_mul", "small_m_mm",
           "small_m_mm_add_rms_norm", "small_m_mm_add_rms_norm_mm", "small_m_mm_silu_mul"]
