"""Block-FP8 routed experts: float8_e4m3fn w13 [E, 2I, H] and w2 [E, H, I] stacked per layer
with one float32 scale per 128x128 block (`*_weight_scale_inv`, the per-expert layout of
Qwen3-MoE-FP8 and DeepSeek-V3 checkpoints, stacked at load), run by `compiled_llm::fused_moe_fp8`.
Activations are quantized per token and group of 128 inputs (the format's dynamic scheme), so
the GEMMs run on FP8 tensor cores; bf16 experts can also be quantized so at load.
"""

from __future__ import annotations

import torch
from torch import nn

from compiled_llm.models.moe import FusedMoE
from compiled_llm.moe import check_moe_shapes
from compiled_llm.moe.reference import fused_moe_reference
from compiled_llm.passes.quant_ops import FP8_DTYPE, FP8_MAX
from compiled_llm.quantization.fp8_groups import FP8_BLOCK, quant_fp8_groups

FUSED_MOE_FP8_OP_NAME = "compiled_llm::fused_moe_fp8"
BLOCK = (FP8_BLOCK, FP8_BLOCK)
SCALE_SUFFIX = "_scale_inv"  # w13_weight -> w13_weight_scale_inv, as the checkpoint names it


@torch.library.custom_op(FUSED_MOE_FP8_OP_NAME, mutates_args=())
def fused_moe_fp8(hidden: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor,
                  w2: torch.Tensor, w2_scale: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor) -> torch.Tensor:
    """compiled_llm::fused_moe's contract with e4m3 w13/w2 times their 128x128 block scales
    (w13_scale [E, 2I/128, H/128], w2_scale [E, H/128, I/128]); both GEMMs' inputs are
    quantized per token and 128 inputs. The Triton grouped GEMM on CUDA, the torch reference
    (same quantization, float32 products) elsewhere."""
    check_moe_shapes(hidden, w13, w2, topk_weights, topk_ids)
    if hidden.is_cuda:
        from compiled_llm.moe.triton_moe import BlockScales, fused_moe_triton

        scales = BlockScales(w13_scale, w2_scale, quant_fp8_groups, BLOCK)
        return fused_moe_triton(hidden, w13, w2, topk_weights, topk_ids, scales=scales)
    return fused_moe_reference(hidden, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale,
                               quant_fp8_groups, BLOCK)


@fused_moe_fp8.register_fake
def _(hidden, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids):
    return torch.empty_like(hidden)


def block_quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [..., N, K] -> (e4m3 [..., N, K], scale f32 [..., N/128, K/128]) per 128x128
    block (N and K multiples of 128), weight ~= q * scale blockwise."""
    *lead, rows, cols = weight.shape
    blocks = weight.float().reshape(*lead, rows // BLOCK[0], BLOCK[0], cols // BLOCK[1], BLOCK[1])
    scale = (blocks.abs().amax(dim=(-3, -1), keepdim=True) / FP8_MAX).clamp(min=1e-12)
    q = (blocks / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).reshape(weight.shape)
    return q, scale.squeeze(-1).squeeze(-2)


def check_block_shape(hidden_size: int, intermediate_size: int) -> None:
    """ValueError naming the field unless both sizes are multiples of the 128 block (gate and
    up rows stack per block; activation groups cover whole K-tiles)."""
    for field, size in (("hidden_size", hidden_size), ("moe_intermediate_size",
                                                       intermediate_size)):
        if size % FP8_BLOCK:
            raise ValueError(f"block-FP8 experts need {field} a multiple of {FP8_BLOCK}, "
                             f"got {size}")


def check_plain_experts(experts: FusedMoE, name: str = "experts") -> None:
    """ValueError unless `experts` are unbiased silu experts: the FP8 op takes no others."""
    if not experts.plain_silu:
        raise ValueError(f"block-FP8 {name}: only silu experts without biases are supported, "
                         f"got activation {experts.activation!r}, "
                         f"bias {experts.w13_bias is not None or experts.w2_bias is not None}")


class Fp8FusedMoE(nn.Module):
    """The routed experts in block FP8: w13_weight / w2_weight e4m3 and their
    *_weight_scale_inv float32 block scales, filled by the loader like any parameter."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int,
                 device: torch.device | None = None) -> None:
        super().__init__()
        check_block_shape(hidden_size, intermediate_size)
        self.num_experts, self.intermediate_size = num_experts, intermediate_size
        shapes = {"w13_weight": (num_experts, 2 * intermediate_size, hidden_size),
                  "w2_weight": (num_experts, hidden_size, intermediate_size)}
        for name, shape in shapes.items():
            scale_shape = (num_experts, shape[1] // BLOCK[0], shape[2] // BLOCK[1])
            self._add(name, torch.empty(shape, dtype=FP8_DTYPE, device=device))
            self._add(name + SCALE_SUFFIX, torch.empty(scale_shape, device=device))

    def _add(self, name: str, tensor: torch.Tensor) -> None:
        self.register_parameter(name, nn.Parameter(tensor, requires_grad=False))

    @classmethod
    def from_dense(cls, experts: FusedMoE) -> Fp8FusedMoE:
        """The experts quantized per 128x128 block (quantization="fp8" at load)."""
        check_plain_experts(experts)
        w13 = experts.w13_weight.detach()
        out = cls(experts.num_experts, w13.shape[2], experts.intermediate_size, w13.device)
        for name in ("w13_weight", "w2_weight"):
            q, scale = block_quantize(getattr(experts, name).detach())
            getattr(out, name).data.copy_(q)
            getattr(out, name + SCALE_SUFFIX).data.copy_(scale)
        return out

    def forward(self, hidden: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor) -> torch.Tensor:
        """hidden [T, H], topk_weights/ids [T, K] -> the weighted sum of the experts [T, H]."""
        return fused_moe_fp8(hidden, self.w13_weight, self.w13_weight_scale_inv,
                             self.w2_weight, self.w2_weight_scale_inv, topk_weights, topk_ids)

    def extra_repr(self) -> str:
        """Experts, sizes and the format."""
        return (f"num_experts={self.num_experts}, hidden={self.w13_weight.shape[2]}, "
                f"intermediate={self.intermediate_size}, fp8 blocks={BLOCK}")


def _swap(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, module)


def prepare_fp8_experts(model: nn.Module, stored: set[str]) -> list[str]:
    """Make every FusedMoE whose stacked weights the checkpoint stores with block scales an
    Fp8FusedMoE (before loading); returns their names."""
    scaled = set()
    for hf_name in stored:
        target = model.weight_name(hf_name) if hf_name.endswith(SCALE_SUFFIX) else None
        if target is not None and not isinstance(target, str):
            scaled.add(target.name)
    names = [name for name, module in model.named_modules()
             if isinstance(module, FusedMoE) and f"{name}.w13_weight{SCALE_SUFFIX}" in scaled]
    for name in names:
        experts = model.get_submodule(name)
        check_plain_experts(experts, name)
        hidden = experts.w13_weight.shape[2]
        _swap(model, name, Fp8FusedMoE(experts.num_experts, hidden, experts.intermediate_size,
                                       experts.w13_weight.device))
    return names


def quantize_experts(model: nn.Module) -> None:
    """Every FusedMoE of the model quantized to block FP8 in place."""
    names = [name for name, module in model.named_modules() if isinstance(module, FusedMoE)]
    for name in names:
        _swap(model, name, Fp8FusedMoE.from_dense(model.get_submodule(name)))
