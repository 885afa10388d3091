"""The runner's KV cache tensors: one [2, N, bs, Hkv, D] tensor per layer in the model's dtype
or FP8, and for FP8 the per-layer, per-head scales [L, 2, Hkv]: the checkpoint's k_scale and
v_scale where it has them (read by the loader through `kv_scale_key`), else 1.0 until the
first real step calibrates them."""

from __future__ import annotations

import math
import re

import numpy as np
import torch

# vLLM's spellings of a layer's KV-cache scales: self_attn.k_scale / v_scale (one kv_scale for
# both in older checkpoints), ModelOpt's k_proj.k_scale, compressed-tensors' k_proj.output_scale
_KV_SCALE = re.compile(
    r"layers\.(\d+)\.self_attn\.(?:([kv])_proj\.)?(k_scale|v_scale|kv_scale|output_scale)$")
# attention-quantization scales for queries and probabilities: attention here computes in
# the model's dtype, so these have no use and are skipped
IGNORED_ATTENTION_SCALES = re.compile(r"self_attn\.(?:attn\.)?(q_scale|prob_scale)$")


def kv_scale_key(name: str) -> tuple[int, tuple[int, ...]] | None:
    """(layer, which: (0,) K, (1,) V, (0, 1) both) for a checkpoint's KV-cache scale name."""
    match = _KV_SCALE.search(name)
    if match is None:
        return None
    layer, proj, kind = int(match.group(1)), match.group(2), match.group(3)
    if kind == "output_scale":
        if proj is None:
            return None
        return layer, ((0,) if proj == "k" else (1,))
    return layer, {"k_scale": (0,), "v_scale": (1,), "kv_scale": (0, 1)}[kind]


def layer_kv_shapes(config) -> list[tuple[int, int]]:
    """(KV heads, head dim) of each layer's cache: the config's kv_cache_shapes where it has
    them (Gemma 4: wider global layers, 0 heads for a layer that reads another's cache), else
    num_key_value_heads and head_dim on every layer."""
    shapes = getattr(config, "kv_cache_shapes", None)
    if shapes is not None:
        return list(shapes)
    return [(config.num_key_value_heads, config.head_dim)] * config.num_hidden_layers


def allocate_caches(config, num_blocks: int, block_size: int, dtype: torch.dtype,
                    device: torch.device) -> list[torch.Tensor]:
    """One zeroed [2, blocks, block_size, KV heads, head dim] tensor per layer."""
    return [_zeros((2, num_blocks, block_size, heads, dim), dtype, device)
            for heads, dim in layer_kv_shapes(config)]


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.zeros; on CPU over calloc'd memory (numpy's zeros), whose pages the OS maps as
    zeros when first touched: a 1 GiB cache costs no memset (0.2 s) nor memory until used."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    memory = np.zeros(nbytes + 64, dtype=np.uint8)
    start = -memory.ctypes.data % 64  # 64-byte aligned, as torch's own allocations are
    return torch.from_numpy(memory[start:start + nbytes]).view(dtype).view(shape)


def initial_scales(config, checkpoint: dict[int, dict[int, torch.Tensor]] | None,
                   device: torch.device) -> tuple[torch.Tensor, bool]:
    """([L, 2, Hkv] float32 scales, whether they still need calibrating): the checkpoint's
    (a scalar per layer, or one per KV head), else ones to be calibrated. A checkpoint with
    some scales but not all is a ValueError."""
    layers, heads = config.num_hidden_layers, config.num_key_value_heads
    if len({shape for shape in layer_kv_shapes(config) if shape[0]}) > 1:
        raise ValueError("kv_cache_dtype fp8 is not supported with layers of different KV "
                         "cache shapes (Gemma 4's global layers)")
    scales = torch.ones(layers, 2, heads, dtype=torch.float32)
    if not checkpoint:
        return scales.to(device), True
    for layer in range(layers):
        for which in (0, 1):
            value = checkpoint.get(layer, {}).get(which)
            if value is None:
                raise ValueError(f"the checkpoint has KV-cache scales, but none for layer "
                                 f"{layer}'s {'KV'[which]}")
            if value.numel() not in (1, heads):
                raise ValueError(f"layer {layer}'s {'kv'[which]}_scale has {value.numel()} "
                                 f"values; expected 1 or one per KV head ({heads})")
            scales[layer, which] = value.float().flatten().cpu()
    return scales.to(device), False
