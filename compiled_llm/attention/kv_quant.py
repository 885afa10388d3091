"""FP8 KV cache: the cache dtypes, quantizing K/V rows as they are written, and calibrating the
per-head scales from the first real step when the checkpoint carries none.

A layer's scales are one float32 tensor [2, Hkv] (K's, then V's): the cache holds x / scale,
and readers fold the scales back in (K's into the score scale, V's into the output)."""

from __future__ import annotations

import torch

KV_CACHE_DTYPES = {
    "fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2,
}
# calibrated scales map the first step's largest |x| to fp8 max / _HEADROOM: later rows up
# to 16x larger still fit, and rows 1,800x smaller are still normal numbers in e4m3
_HEADROOM = 16.0


def cache_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The KV cache's torch dtype: the model's for "auto", else the FP8 format named."""
    if kv_cache_dtype == "auto":
        return model_dtype
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be auto or one of {sorted(KV_CACHE_DTYPES)}, "
                         f"got {kv_cache_dtype!r}")
    return KV_CACHE_DTYPES[kv_cache_dtype]


def is_fp8(dtype: torch.dtype) -> bool:
    """Whether a cache of this dtype holds scaled FP8 values."""
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def quantize(rows: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """rows [T, Hkv, D] / scales [Hkv], saturated to the format's range, as `dtype`."""
    limit = torch.finfo(dtype).max
    return (rows.float() / scales[None, :, None]).clamp(-limit, limit).to(dtype)


def dequantize(cached: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """cached [..., Hkv, D] FP8 times scales [Hkv], as `dtype` (the reference's reads)."""
    return (cached.to(torch.float32) * scales[:, None]).to(dtype)


def calibrate(k: torch.Tensor, v: torch.Tensor, scales: torch.Tensor, num_rows: int,
              dtype: torch.dtype) -> None:
    """Set scales [2, Hkv] in place from rows [:num_rows] of k/v [T, Hkv, D]: each head's
    largest |x| lands at the format's max over _HEADROOM; a head of all zeros keeps 1.0."""
    if num_rows == 0:
        return
    target = torch.finfo(dtype).max / _HEADROOM
    for index, rows in enumerate((k[:num_rows], v[:num_rows])):
        amax = rows.detach().abs().amax(dim=(0, 2)).float()  # [Hkv]
        scales[index].copy_(torch.where(amax > 0, amax / target, torch.ones_like(amax)))
