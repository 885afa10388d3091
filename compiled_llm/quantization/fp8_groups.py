"""Per-token-group FP8 activation quantization (one scale per 128 inputs), as block-FP8
checkpoints (DeepSeek-V3, Qwen3-FP8) quantize activations; shared by the reference and kernel."""

from __future__ import annotations

import torch

from compiled_llm.passes.quant_ops import FP8_DTYPE, FP8_MAX, MIN_SCALE

FP8_BLOCK = 128


def quant_fp8_groups(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q e4m3 [M, K], scale f32 [M, K / 128]), one scale per 128 inputs."""
    rows, k = x.shape
    groups = x.float().reshape(rows, k // FP8_BLOCK, FP8_BLOCK)
    scale = (groups.abs().amax(-1, keepdim=True) / FP8_MAX).clamp(min=MIN_SCALE)
    q = (groups / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.reshape(rows, k), scale.reshape(rows, k // FP8_BLOCK)
