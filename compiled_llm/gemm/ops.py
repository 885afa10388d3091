"""The `compiled_llm::small_m_mm` op: x [M, K] @ weight [N, K]^T. On CUDA it runs the Triton
kernel with the config tuned for (M, N, K, GPU) in the 16-bit dtypes, else cuBLAS (torch.mm);
on the CPU always torch.mm. The choice reads only shapes, so a captured CUDA graph keeps one.
`compiled_llm::small_m_mm_silu_mul` likewise, with silu(gate) * up made in the kernel's prologue."""

from __future__ import annotations

import torch
import torch.nn.functional as F

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


@torch.library.custom_op(f"{LIB}::small_m_mm_silu_mul", mutates_args=())
def small_m_mm_silu_mul(gate: torch.Tensor, up: torch.Tensor,
                        weight: torch.Tensor) -> torch.Tensor:
    """gate, up [M, K], weight [N, K] -> (silu(gate) * up) @ weight.T [M, N]: the gated Triton
    kernel with small_m_mm's tuned config for gate's shape, else silu * up then torch.mm."""
    config = tuned_config(gate, weight)
    if config is None:
        return torch.mm(F.silu(gate) * up, weight.t())  # passes/ops.py silu_and_mul_ref
    from compiled_llm.gemm.kernels import small_m_mm_silu_mul_triton

    return small_m_mm_silu_mul_triton(gate, up, weight, config)


@small_m_mm_silu_mul.register_fake
def _small_m_mm_silu_mul_fake(gate, up, weight):
    return gate.new_empty((gate.shape[0], weight.shape[0]))
