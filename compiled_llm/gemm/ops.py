"""The `compiled_llm::small_m_mm` op: x [M, K] @ weight [N, K]^T. On CUDA it runs the Triton
kernel with the config tuned for (M, N, K, GPU) in the 16-bit dtypes, else cuBLAS (torch.mm);
on the CPU always torch.mm. The choice reads only shapes, so a captured CUDA graph keeps one."""

from __future__ import annotations

import torch

from compiled_llm.gemm.tuning import tuned_config

LIB = "compiled_llm"


@torch.library.custom_op(f"{LIB}::small_m_mm", mutates_args=())
def small_m_mm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M, K], weight [N, K] -> x @ weight.T [M, N]."""
    config = tuned_config(x, weight)
    if config is None:
        return torch.mm(x, weight.t())
    from compiled_llm.gemm.kernels import small_m_mm_triton

    return small_m_mm_triton(x, weight, config)


@small_m_mm.register_fake
def _small_m_mm_fake(x, weight):
    return x.new_empty((x.shape[0], weight.shape[0]))
