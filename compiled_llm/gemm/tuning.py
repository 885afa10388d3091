"""Small-M GEMM path choice per GPU and shape: one JSON file (benchmarks/small_m_gemm_tune.py
writes it), {"devices": {GPU: {"N,K": {M: SmallMConfig fields | "cublas"}}}}, read from
$COMPILED_LLM_SMALL_M_GEMM_CONFIG, then the shipped configs/small_m_gemm.json. Tuned in bf16, used
for the 16-bit dtypes; float32, no entry, or M past the shape's largest tuned M: cuBLAS."""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

CONFIG_ENV = "COMPILED_LLM_SMALL_M_GEMM_CONFIG"
SHIPPED = Path(__file__).resolve().parent / "configs" / "small_m_gemm.json"
MAX_M = 16  # the most tokens the Triton kernel is built for
CUBLAS = "cublas"
TUNED_DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class SmallMConfig:
    """One launch: each program reads block_n rows of W over a 1/split_k share of K, block_k
    columns at a time; use_dot: an MMA over the token rows padded to 16 (block_n >= 16)."""

    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    use_dot: bool = False


Entry = SmallMConfig | str  # a config, or CUBLAS


def _entry(raw) -> Entry:
    return CUBLAS if raw == CUBLAS else SmallMConfig(**raw)


@functools.cache
def load_table(path: str) -> dict[str, dict[str, dict[int, Entry]]]:
    """{GPU name: {"N,K": {M: config or "cublas"}}} of one file ({} when it is absent)."""
    if not Path(path).is_file():
        return {}
    devices = json.loads(Path(path).read_text()).get("devices", {})
    return {gpu: {shape: {int(m): _entry(raw) for m, raw in by_m.items()}
                  for shape, by_m in shapes.items()} for gpu, shapes in devices.items()}


def shape_key(n: int, k: int) -> str:
    """The table's key of a weight [n, k]."""
    return f"{n},{k}"


def lookup(gpu: str, m: int, n: int, k: int) -> SmallMConfig | None:
    """The config for m tokens and a [n, k] weight on `gpu`: the entry of the smallest tuned
    M >= m, from the override file if it has the shape, else the shipped one; None means
    cuBLAS (no entry, m past the largest tuned M or past MAX_M, or a "cublas" entry)."""
    if m > MAX_M or m < 1:
        return None
    for path in (os.environ.get(CONFIG_ENV), str(SHIPPED)):
        by_m = load_table(path).get(gpu, {}).get(shape_key(n, k)) if path else None
        if by_m:
            covering = [tuned for tuned in by_m if tuned >= m]
            if not covering:
                return None
            entry = by_m[min(covering)]
            return entry if isinstance(entry, SmallMConfig) else None
    return None


@functools.cache
def device_name(index: int) -> str:
    """torch.cuda.get_device_name, once per device."""
    return torch.cuda.get_device_name(index)


def tuned_config(x: torch.Tensor, weight: torch.Tensor) -> SmallMConfig | None:
    """lookup() for x [M, K] @ weight [N, K]^T on x's GPU; None (cuBLAS) on the CPU, for
    dtypes not tuned, and for mixed dtypes."""
    if x.device.type != "cuda" or x.dtype not in TUNED_DTYPES or weight.dtype != x.dtype:
        return None
    return lookup(device_name(x.device.index or 0), x.shape[0], weight.shape[0], x.shape[1])


def triton_tuned(device: torch.device, dtype: torch.dtype, n: int, k: int) -> bool:
    """Whether a [n, k] weight in dtype takes the Triton kernel at some token count on device."""
    if device.type != "cuda" or dtype not in TUNED_DTYPES:
        return False
    gpu = device_name(device.index or 0)
    return any(lookup(gpu, m, n, k) is not None for m in range(1, MAX_M + 1))


def tuned_splits(device: torch.device, dtype: torch.dtype, n: int, k: int) -> set[int]:
    """The split_k of every Triton config a [n, k] weight in dtype takes on device over the token
    counts 1..MAX_M (empty: cuBLAS throughout), which tells the fusion passes whether an epilogue
    pays: after split-K a sum kernel runs anyway; without it the GEMM holds whole products."""
    if device.type != "cuda" or dtype not in TUNED_DTYPES:
        return set()
    gpu = device_name(device.index or 0)
    configs = (lookup(gpu, m, n, k) for m in range(1, MAX_M + 1))
    return {config.split_k for config in configs if config is not None}
