"""Dense GEMMs of few tokens (decode): the `compiled_llm::small_m_mm` op (ops.py), its Triton
split-K kernel (kernels.py) and the tuned choice between it and cuBLAS per GPU and shape
(tuning.py, configs/small_m_gemm.json). passes/small_m_gemm.py puts the op in the graph, and
passes/silu_mul_small_m.py its gated-MLP variant (`small_m_mm_silu_mul`), passes/
small_m_add_rms_norm.py and small_m_silu_mul.py the ones with an epilogue (epilogue.py)."""

from compiled_llm.gemm.ops import (
    small_m_gate_up_silu_mul,
    small_m_mm,
    small_m_mm_add_rms_norm,
    small_m_mm_silu_mul,
)
from compiled_llm.gemm.tuning import SmallMConfig

__all__ = ["SmallMConfig", "small_m_gate_up_silu_mul", "small_m_mm", "small_m_mm_add_rms_norm",
           "small_m_mm_silu_mul"]
