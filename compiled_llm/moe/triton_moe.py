"""The CUDA path of `compiled_llm::fused_moe` (and of block-FP8 experts, BlockScales): align the
routing to expert blocks, the gated grouped GEMM over w13 (bias and silu or swigluoai fused), the
grouped GEMM over w2 (bias, then the routing weights), the sum over each token's top-k rows. Tiles:
the tuned file of the shape and GPU (moe/tuning.py), else a small table by tokens per expert.
CPU tensors run the same kernels through Triton's interpreter (TRITON_INTERPRET=1; for tests)."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

from compiled_llm.moe.kernels import (
    MoeGemmConfig,
    kernels_interpreted,
    moe_align_block_size,
    moe_gemm,
)
from compiled_llm.moe.reference import SILU, ActQuant, GatedActivation
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


def check_triton_inputs(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                        scaled: bool = False) -> None:
    """ValueError for inputs the kernels do not take: mixed or unsupported dtypes (weights of
    hidden's dtype, or FP8 e4m3 with block scales), CPU tensors without the interpreter."""
    weight_dtypes = {torch.float8_e4m3fn} if scaled else {hidden.dtype}
    if hidden.dtype not in SUPPORTED_DTYPES or {w13.dtype, w2.dtype} != weight_dtypes:
        raise ValueError(f"fused_moe needs hidden of {SUPPORTED_DTYPES} and w13, w2 of its "
                         "dtype (float8_e4m3fn with block scales), got "
                         f"{hidden.dtype}, {w13.dtype}, {w2.dtype}")
    if hidden.device.type != "cuda" and not kernels_interpreted():
        raise ValueError(f"the Triton fused MoE needs CUDA tensors, got {hidden.device} "
                         "(CPU runs need TRITON_INTERPRET=1 before Triton is imported)")


class BlockScales(NamedTuple):
    """Block-FP8 experts: the weights' scales per block and the activations' quantizer."""

    w13_scale: torch.Tensor  # [E, 2I / block[0], H / block[1]]
    w2_scale: torch.Tensor  # [E, H / block[0], I / block[1]]
    act_quant: ActQuant  # x [M, K] -> (q e4m3, scale [M, K / block[1]])
    block: tuple[int, int] = (128, 128)


class Epilogue(NamedTuple):
    """The experts' optional per-expert biases ([E, 2I], [E, H]) and gated activation."""

    w13_bias: torch.Tensor | None = None
    w2_bias: torch.Tensor | None = None
    activation: GatedActivation = SILU

    def check_unscaled(self) -> None:
        """ValueError when set: the block-FP8 experts take plain silu experts only."""
        if (self.w13_bias is not None or self.w2_bias is not None
                or self.activation.name != "silu"):
            raise ValueError("block-FP8 fused_moe takes silu experts without biases, got "
                             f"activation {self.activation.name!r}, w13_bias "
                             f"{self.w13_bias is not None}, w2_bias {self.w2_bias is not None}")


def _fused_moe_chunk(hidden, w13, w2, topk_weights, topk_ids, out, config, scales,
                     epilogue: Epilogue) -> None:
    num_tokens, top_k = topk_ids.shape
    num_experts, hidden_size = w13.shape[0], w13.shape[2]
    # one more expert id than the weights hold: id E is another rank's (expert parallelism)
    routing = moe_align_block_size(topk_ids, config.block_m, num_experts + 1)
    entries = num_tokens * top_k
    act = torch.empty(entries, w2.shape[2], dtype=hidden.dtype, device=hidden.device)
    down = torch.empty(entries, hidden_size, dtype=hidden.dtype, device=hidden.device)
    weights = topk_weights.reshape(-1).float()
    if scales is None:
        moe_gemm(hidden, w13, act, routing, None, True, top_k, config, bias=epilogue.w13_bias,
                 activation=epilogue.activation)
        moe_gemm(act, w2, down, routing, weights, False, 1, config, bias=epilogue.w2_bias)
    else:
        x_q, x_scale = scales.act_quant(hidden)
        moe_gemm(x_q, w13, act, routing, None, True, top_k, config, x_scale, scales.w13_scale,
                 scales.block)
        act_q, act_scale = scales.act_quant(act)
        moe_gemm(act_q, w2, down, routing, weights, False, 1, config, act_scale,
                 scales.w2_scale, scales.block)
    torch.sum(down.view(num_tokens, top_k, hidden_size), dim=1, out=out)


def fused_moe_triton(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                     topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                     config: MoeGemmConfig | None = None,
                     scales: BlockScales | None = None,
                     out: torch.Tensor | None = None,
                     w13_bias: torch.Tensor | None = None,
                     w2_bias: torch.Tensor | None = None,
                     activation: GatedActivation = SILU) -> torch.Tensor:
    """The op's contract (compiled_llm.moe.fused_moe) on the Triton kernels; no host sync.
    With `scales`, w13 and w2 are block-FP8 and both GEMMs read quantized activations (no
    biases, silu only); the result goes to `out` when given (like hidden)."""
    check_triton_inputs(hidden, w13, w2, scaled=scales is not None)
    epilogue = Epilogue(w13_bias, w2_bias, activation)
    if scales is not None:
        epilogue.check_unscaled()
    hidden = hidden.contiguous()
    num_tokens, top_k = topk_ids.shape
    out = torch.empty_like(hidden) if out is None else out
    if config is None:
        tokens = min(num_tokens, CHUNK_TOKENS)
        config = tuned_config(tokens, w13) or moe_gemm_config(tokens, top_k, w13.shape[0],
                                                              hidden.dtype)
    for start in range(0, num_tokens, CHUNK_TOKENS):
        rows = slice(start, start + CHUNK_TOKENS)
        _fused_moe_chunk(hidden[rows], w13, w2, topk_weights[rows], topk_ids[rows], out[rows],
                         config, scales, epilogue)
    return out
