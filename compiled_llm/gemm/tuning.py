"""Small-M GEMM path choice per GPU and shape: one JSON file (benchmarks/small_m_gemm_tune.py
writes it), {"devices": {GPU: {"N,K" | "gate_up:N,K": {M: SmallMConfig | "cublas" | "unfused"}}}},
from $COMPILED_LLM_SMALL_M_GEMM_CONFIG, then the shipped configs/small_m_gemm.json. Tuned in bf16,
used for the 16-bit dtypes; float32, no entry, or M past the largest tuned M: cuBLAS. "gate_up:"
keys tune the GATE_UP epilogue (block_n: gate rows); without one it takes the plain config."""

from __future__ import annotations

import dataclasses
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
UNFUSED = "unfused"  # a gate_up entry: the plain product, then the SiLU·mul kernel
GATE_UP = "gate_up"  # the variant of the GATE_UP epilogue, keys "gate_up:N,K"
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


Entry = SmallMConfig | str  # a config, CUBLAS, or (gate_up keys) UNFUSED


def _entry(raw) -> Entry:
    return raw if raw in (CUBLAS, UNFUSED) else SmallMConfig(**raw)


@functools.cache
def load_table(path: str) -> dict[str, dict[str, dict[int, Entry]]]:
    """{GPU name: {key: {M: config, "cublas" or "unfused"}}} of one file ({} when it is absent)."""
    if not Path(path).is_file():
        return {}
    devices = json.loads(Path(path).read_text()).get("devices", {})
    return {gpu: {shape: {int(m): _entry(raw) for m, raw in by_m.items()}
                  for shape, by_m in shapes.items()} for gpu, shapes in devices.items()}


def shape_key(n: int, k: int, variant: str = "") -> str:
    """The table's key of a weight [n, k]: "N,K" for the plain product, else "variant:N,K"."""
    return f"{variant}:{n},{k}" if variant else f"{n},{k}"


def table_paths() -> tuple[str, ...]:
    """The files lookups read, first match wins: the override (if set), then the shipped one."""
    override = os.environ.get(CONFIG_ENV)
    return (override, str(SHIPPED)) if override else (str(SHIPPED),)


def tuned_entry(gpu: str, m: int, n: int, k: int, variant: str = "",
                paths: tuple[str, ...] | None = None) -> Entry | None:
    """The entry of the smallest tuned M >= m under shape_key(n, k, variant) on `gpu`, from the
    first of `paths` (default table_paths()) that has the key; None: no file has it. m outside
    1..MAX_M or past the largest tuned M: CUBLAS for the plain product, UNFUSED for a variant."""
    past = UNFUSED if variant else CUBLAS
    if m > MAX_M or m < 1:
        return past
    for path in paths or table_paths():
        by_m = load_table(path).get(gpu, {}).get(shape_key(n, k, variant))
        if by_m:
            covering = [tuned for tuned in by_m if tuned >= m]
            return by_m[min(covering)] if covering else past
    return None


def lookup(gpu: str, m: int, n: int, k: int) -> SmallMConfig | None:
    """The plain product's config for m tokens and a [n, k] weight on `gpu` (tuned_entry); None
    means cuBLAS (no entry, m past the largest tuned M or past MAX_M, or a "cublas" entry)."""
    entry = tuned_entry(gpu, m, n, k)
    return entry if isinstance(entry, SmallMConfig) else None


def gate_up_lookup(gpu: str, m: int, n: int, k: int) -> SmallMConfig | None:
    """The GATE_UP epilogue's config for m tokens and W = [gate; up] [n, k]; None: the unfused
    path (the product, then SiLU·mul). The "gate_up:N,K" entry where the table has the key (its
    block_n is gate rows per program), else the plain product's config if it has no split-K,
    block_n halved: each program reads the plain tile's rows, half gate, half up."""
    entry = tuned_entry(gpu, m, n, k, GATE_UP)
    if entry is not None:
        return entry if isinstance(entry, SmallMConfig) else None
    return gate_up_from_plain(lookup(gpu, m, n, k))


def gate_up_from_plain(plain: SmallMConfig | None) -> SmallMConfig | None:
    """The epilogue's config from the plain product's (None: cuBLAS): the same grid, block_n / 2
    gate rows and as many up rows a program; None where plain splits K (or is None)."""
    if plain is None or plain.split_k != 1:
        return None
    return dataclasses.replace(plain, block_n=max(plain.block_n // 2, 16 if plain.use_dot else 1))


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


def gate_up_config(x: torch.Tensor, weight: torch.Tensor) -> SmallMConfig | None:
    """gate_up_lookup() for x [M, K] and weight [2I, K] on x's GPU; None (the unfused path) on
    the CPU, for dtypes not tuned, and for mixed dtypes."""
    if x.device.type != "cuda" or x.dtype not in TUNED_DTYPES or weight.dtype != x.dtype:
        return None
    return gate_up_lookup(device_name(x.device.index or 0), x.shape[0], weight.shape[0],
                          x.shape[1])


def gate_up_fused(device: torch.device, dtype: torch.dtype, n: int, k: int) -> bool:
    """Whether W = [gate; up] [n, k] in dtype takes the GATE_UP epilogue at some token count on
    device (the SiLU·mul fusion pass's condition)."""
    if device.type != "cuda" or dtype not in TUNED_DTYPES:
        return False
    gpu = device_name(device.index or 0)
    return any(gate_up_lookup(gpu, m, n, k) is not None for m in range(1, MAX_M + 1))


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
