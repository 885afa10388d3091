"""The `compiled_llm::small_m_mm` op, x [M, K] @ weight [N, K]^T: on CUDA the Triton kernel tuned
for (M, N, K, GPU) in the 16-bit dtypes, else cuBLAS; on the CPU torch.mm (the choice reads only
shapes: a captured CUDA graph keeps one). Fused variants: `small_m_mm_silu_mul`,
`small_m_gate_up_silu_mul` (SiLU·mul in the prologue, the epilogue), `small_m_mm_add_rms_norm`
(add + RMSNorm in the split-K sum), `small_m_mm_add_rms_norm_mm` (in the next GEMM's prologue)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from compiled_llm.gemm.tuning import gate_up_config, tuned_config

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


def rms_norm_reference(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The models' RMSNorm (models/layers.py): float32 statistics, cast back, then scaled."""
    hidden_f32 = hidden.float()
    hidden_f32 = hidden_f32 * torch.rsqrt(hidden_f32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * hidden_f32.to(hidden.dtype)


def _fits_epilogue(x, weight, residual, norm_weight) -> bool:
    """Whether the CUDA epilogue kernel takes these: one dtype, row-major rows, a 1-D norm."""
    return (x.device.type == "cuda" and residual.dtype == x.dtype == weight.dtype
            and residual.shape == (x.shape[0], weight.shape[0]) and residual.stride(1) == 1
            and norm_weight.shape == (weight.shape[0],) and norm_weight.is_contiguous()
            and residual.device == norm_weight.device == x.device)


@torch.library.custom_op(f"{LIB}::small_m_mm_add_rms_norm", mutates_args=())
def small_m_mm_add_rms_norm(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor,
                            norm_weight: torch.Tensor,
                            eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x @ weight.T + residual), x @ weight.T + residual), each [M, N]: on CUDA the
    small-M GEMM's split-K partials (or cuBLAS's product) summed, added and normalized by one
    kernel (epilogue.py); elsewhere torch.mm, then the add and the norm as the models write them."""
    if not _fits_epilogue(x, weight, residual, norm_weight):
        summed = small_m_mm(x, weight) + residual  # the unfused path, as the pass found it
        return rms_norm_reference(summed, norm_weight, eps), summed
    from compiled_llm.gemm.epilogue import sum_add_rms_norm
    from compiled_llm.gemm.kernels import small_m_partials

    partials = small_m_partials(x, weight, tuned_config(x, weight))
    return sum_add_rms_norm(partials, residual, norm_weight, eps)


@small_m_mm_add_rms_norm.register_fake
def _small_m_mm_add_rms_norm_fake(x, weight, residual, norm_weight, eps):
    summed = residual.new_empty((x.shape[0], weight.shape[0]),
                                dtype=torch.promote_types(x.dtype, residual.dtype))
    normed = summed.new_empty(summed.shape,
                              dtype=torch.promote_types(residual.dtype, norm_weight.dtype))
    return normed, summed


@torch.library.custom_op(f"{LIB}::small_m_gate_up_silu_mul", mutates_args=())
def small_m_gate_up_silu_mul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M, K], weight [2I, K] (gate rows, then up rows) -> silu(x @ gate^T) * (x @ up^T)
    [M, I]: on CUDA the small-M kernel's GATE_UP epilogue with tuning.gate_up_config's config
    (its own "gate_up:N,K" entry, else the plain one without split-K), else small_m_mm then one
    SiLU·mul kernel; on the CPU torch.mm, then silu * up as written."""
    if x.device.type != "cuda":
        gate, up = torch.mm(x, weight.t()).chunk(2, dim=-1)
        return F.silu(gate) * up  # passes/ops.py silu_and_mul_ref
    from compiled_llm.gemm.epilogue import silu_mul_halves
    from compiled_llm.gemm.kernels import small_m_gate_up_silu_mul_triton

    config = gate_up_config(x, weight)
    if config is not None:
        return small_m_gate_up_silu_mul_triton(x, weight, config)
    return silu_mul_halves(small_m_mm(x, weight))


@small_m_gate_up_silu_mul.register_fake
def _small_m_gate_up_silu_mul_fake(x, weight):
    return x.new_empty((x.shape[0], weight.shape[0] // 2))


def _prologue_config(residual, norm_weight, weight2, gate_up: bool):
    """The tuned config of the GEMM after the norm where the prologue kernel takes the pair
    (CUDA, one dtype, few enough rows), else None."""
    from compiled_llm.gemm.prologue import norm_prologue_fits

    if (residual.device.type != "cuda" or norm_weight.dtype != residual.dtype
            or not norm_prologue_fits(*residual.shape)):
        return None
    return (gate_up_config if gate_up else tuned_config)(residual, weight2)


@torch.library.custom_op(f"{LIB}::small_m_mm_add_rms_norm_mm", mutates_args=())
def small_m_mm_add_rms_norm_mm(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor,
                               norm_weight: torch.Tensor, eps: float, weight2: torch.Tensor,
                               gate_up: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(y2, s): s = x @ weight.T + residual, y2 = rms_norm(s) @ weight2.T (gate_up: silu(gate) *
    up of that product's halves). On CUDA, where the second GEMM is tuned and the rows fit: the
    first GEMM's partials, then one kernel whose programs add and normalize in a prologue
    (prologue.py); else small_m_mm_add_rms_norm, then the second op, as the pass found them."""
    config2 = None
    if _fits_epilogue(x, weight, residual, norm_weight):
        config2 = _prologue_config(residual, norm_weight, weight2, gate_up)
    if config2 is None:
        normed, summed = small_m_mm_add_rms_norm(x, weight, residual, norm_weight, eps)
        second = small_m_gate_up_silu_mul if gate_up else small_m_mm
        return second(normed, weight2), summed
    from compiled_llm.gemm.kernels import small_m_partials
    from compiled_llm.gemm.prologue import small_m_norm_mm_triton

    partials = small_m_partials(x, weight, tuned_config(x, weight))
    return small_m_norm_mm_triton(partials, residual, norm_weight, eps, weight2, config2,
                                  gate_up)


@small_m_mm_add_rms_norm_mm.register_fake
def _small_m_mm_add_rms_norm_mm_fake(x, weight, residual, norm_weight, eps, weight2, gate_up):
    _, summed = _small_m_mm_add_rms_norm_fake(x, weight, residual, norm_weight, eps)
    width = weight2.shape[0] // 2 if gate_up else weight2.shape[0]
    return summed.new_empty((x.shape[0], width)), summed
