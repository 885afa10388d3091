"""PyTorch's tinygemm int4 kernel (`aten._weight_int4pack_mm`) as the small-M path of W4A16:
the canonical (qweight, scales, zeros) turned into its packed weight and bf16 scales_and_zeros
(once, at load, by w4a16.prepare_tinygemm). tinygemm dequantizes w = (q - 8) * scale + offset per
group, so our zero point z becomes offset = (8 - z) * scale.
"""

from __future__ import annotations

import logging

import torch

from compiled_llm.quantization.packing import unpack_int4

logger = logging.getLogger(__name__)

INNER_K_TILES = 8  # k-tiles of 16 per packed word group: 16-byte loads, K % 128 == 0
GROUP_SIZES = (32, 64, 128, 256)  # the group sizes the CUDA kernel is built for
N_TILE = 8  # output rows per packed tile: row slices must start and end on a multiple


def tinygemm_qualifies(out_features: int, in_features: int, group_size: int,
                       dtype: torch.dtype) -> bool:
    """Whether tinygemm can run an [out_features, in_features] weight: bf16 scales (the
    activation dtype), a group size it is built for, N % 8 == 0 and K % (INNER_K_TILES * 16)."""
    return (dtype == torch.bfloat16 and group_size in GROUP_SIZES
            and out_features % N_TILE == 0 and in_features % (INNER_K_TILES * 16) == 0
            and in_features % group_size == 0)


def tinygemm_scales_zeros(scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """scales, zeros [N, K/group] -> bf16 [N, K/group, 2] of (scale, (8 - zero) * scale),
    stored as tinygemm's contiguous [K/group, N, 2] (dim 0 is N so that row views narrow it;
    transpose(0, 1) is contiguous over whole rows)."""
    scale = scales.float()
    offset = (8.0 - zeros.float()) * scale
    packed = torch.stack([scale, offset], dim=-1).transpose(0, 1).contiguous()
    return packed.to(torch.bfloat16).transpose(0, 1)


def tinygemm_uint8(qweight: torch.Tensor) -> torch.Tensor:
    """Canonical int32 [N, K/8] -> uint8 [N, K/2], the CUDA convert's input: input k = 2i in
    the high nibble of byte i, k = 2i + 1 in the low one."""
    values = unpack_int4(qweight)
    return (values[:, 0::2] << 4) | values[:, 1::2]


def pack_tinygemm(qweight: torch.Tensor) -> torch.Tensor:
    """Canonical int32 [N, K/8] (CUDA) -> tinygemm's packed weight viewed as int32 [N, K/8]:
    its [N/8, K/(INNER_K_TILES*16), 32, INNER_K_TILES/2] layout holds each 8-row tile
    contiguously, so rows [8a, 8b) of this view are tiles [a, b)."""
    packed = torch.ops.aten._convert_weight_to_int4pack(tinygemm_uint8(qweight), INNER_K_TILES)
    return packed.reshape(qweight.shape)


def tinygemm_mm(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor,
                group_size: int) -> torch.Tensor:
    """x [M, K] bf16 @ dequant(packed rows [N, K/8], scales_zeros [N, K/group, 2]).T -> bf16
    [M, N]; a partial row view of the scales (no fusion pass) is made contiguous per call."""
    k, n = x.shape[1], packed.shape[0]
    weight = packed.reshape(n // N_TILE, k // (INNER_K_TILES * 16), 32, INNER_K_TILES // 2)
    return torch.ops.aten._weight_int4pack_mm(x.contiguous(), weight, group_size,
                                              scales_zeros.transpose(0, 1).contiguous())


def tinygemm_tensors(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                      group_size: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(packed, scales_zeros) of one (fused) weight, or None when it does not qualify."""
    n, k = qweight.shape[0], qweight.shape[1] * 8
    if not tinygemm_qualifies(n, k, group_size, scales.dtype):
        return None
    return pack_tinygemm(qweight), tinygemm_scales_zeros(scales, zeros)


def tinygemm_available(device: torch.device) -> bool:
    """Whether this GPU and torch build run tinygemm: a tiny weight packed and multiplied
    (once per device); False with one log line if either raises."""
    key = str(device)
    if key not in _AVAILABLE:
        try:
            qweight = torch.zeros(N_TILE, INNER_K_TILES * 2, dtype=torch.int32, device=device)
            scales = torch.ones(N_TILE, 1, dtype=torch.bfloat16, device=device)
            made = tinygemm_tensors(qweight, scales, torch.zeros_like(scales), 128)
            x = torch.ones(1, qweight.shape[1] * 8, dtype=torch.bfloat16, device=device)
            tinygemm_mm(x, *made, 128)
            _AVAILABLE[key] = True
        except RuntimeError as exc:  # no tinygemm kernel for this GPU or torch build
            logger.warning("W4A16: tinygemm unavailable on %s (%s); the Triton kernel runs",
                           key, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            _AVAILABLE[key] = False
    return _AVAILABLE[key]


_AVAILABLE: dict[str, bool] = {}
