"""The CUDA path of `compiled_llm::fused_moe`: align the routing to expert blocks, the gated
grouped GEMM over w13 (silu(gate) * up fused), the grouped GEMM over w2 with the routing
weights applied, then the sum over each token's top-k rows. Tile configs come from the tuned
file of the layer's shape and GPU (moe/tuning.py), else a small table by tokens per expert.
CPU tensors run the same kernels through Triton's interpreter (TRITON_INTERPRET=1; for tests).
"""

from __future__ import annotations

import dataclasses

import torch

from compiled_llm.moe.kernels import (
    MoeGemmConfig,
    kernels_interpreted,
    moe_align_block_size,
    moe_gemm,
)
from compiled_llm.moe.tuning import tuned_config

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Tokens per launch: bounds the [T * top_k, H] scratch of the down projection for long prefills.
CHUNK_TOKENS = 16384

# (largest tokens-per-expert, config) for 16-bit weights on Hopper, smallest first
CONFIG_TABLE = (
    (16, MoeGemmConfig(block_m=16, block_n=64, block_k=128, group_m=1, num_warps=4,
                       num_stages=4)),  # decode: the weights' bandwidth is all that counts
    (64, MoeGemmConfig(block_m=32, block_n=64, block_k=128, group_m=8, num_warps=4,
                       num_stages=4)),
    (256, MoeGemmConfig(block_m=64, block_n=128, block_k=64, group_m=8, num_warps=4,
                        num_stages=3)),
    (None, MoeGemmConfig(block_m=128, block_n=128, block_k=64, group_m=8, num_warps=8,
                         num_stages=3)),
)


def moe_gemm_config(num_tokens: int, top_k: int, num_experts: int,
                    dtype: torch.dtype) -> MoeGemmConfig:
    """The table's config for the expected rows per expert; float32 halves block_k (the tiles
    are twice the bytes, shared memory is not)."""
    per_expert = num_tokens * top_k / num_experts
    config = next(cfg for limit, cfg in CONFIG_TABLE if limit is None or per_expert <= limit)
    if dtype == torch.float32:
        config = dataclasses.replace(config, block_k=config.block_k // 2)
    return config


def check_triton_inputs(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> None:
    """ValueError for inputs the kernels do not take: mixed or unsupported dtypes (FP8 weights
    have no kernel yet), CPU tensors without the interpreter."""
    if hidden.dtype not in SUPPORTED_DTYPES or {w13.dtype, w2.dtype} != {hidden.dtype}:
        raise ValueError(f"fused_moe needs hidden, w13 and w2 of one dtype of {SUPPORTED_DTYPES}, "
                         f"got {hidden.dtype}, {w13.dtype}, {w2.dtype}")
    if hidden.device.type != "cuda" and not kernels_interpreted():
        raise ValueError(f"the Triton fused MoE needs CUDA tensors, got {hidden.device} "
                         "(CPU runs need TRITON_INTERPRET=1 before Triton is imported)")


def _fused_moe_chunk(hidden, w13, w2, topk_weights, topk_ids, out, config) -> None:
    num_tokens, top_k = topk_ids.shape
    num_experts, hidden_size = w13.shape[0], w13.shape[2]
    routing = moe_align_block_size(topk_ids, config.block_m, num_experts)
    entries = num_tokens * top_k
    act = torch.empty(entries, w2.shape[2], dtype=hidden.dtype, device=hidden.device)
    moe_gemm(hidden, w13, act, routing, None, True, top_k, config)
    down = torch.empty(entries, hidden_size, dtype=hidden.dtype, device=hidden.device)
    weights = topk_weights.reshape(-1).float()
    moe_gemm(act, w2, down, routing, weights, False, 1, config)
    torch.sum(down.view(num_tokens, top_k, hidden_size), dim=1, out=out)


def fused_moe_triton(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                     topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                     config: MoeGemmConfig | None = None) -> torch.Tensor:
    """The op's contract (compiled_llm.moe.fused_moe) on the Triton kernels; no host sync."""
    check_triton_inputs(hidden, w13, w2)
    hidden = hidden.contiguous()
    num_tokens, top_k = topk_ids.shape
    out = torch.empty_like(hidden)
    if config is None:
        tokens = min(num_tokens, CHUNK_TOKENS)
        config = tuned_config(tokens, w13) or moe_gemm_config(tokens, top_k, w13.shape[0],
                                                              hidden.dtype)
    for start in range(0, num_tokens, CHUNK_TOKENS):
        rows = slice(start, start + CHUNK_TOKENS)
        _fused_moe_chunk(hidden[rows], w13, w2, topk_weights[rows], topk_ids[rows], out[rows],
                         config)
    return out
