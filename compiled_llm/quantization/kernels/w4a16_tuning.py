"""W4A16 path choice per GPU and shape: one JSON file (benchmarks/w4a16_tune.py writes it),
{"devices": {GPU: {"NxK": {tokens: W4A16Config fields}}}, "tinygemm_max_rows": {GPU: rows}}, from
$COMPILED_LLM_W4A16_CONFIG, then the shipped configs/w4a16.json (no entry: w4a16_config's tiles).
Up to tinygemm_max_rows tokens (default 4) tinygemm runs; from DEFAULT_DEQUANT_MIN_ROWS on,
dequantize-then-matmul (kernels/w4a16_dequant.py)."""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class W4A16Config:
    """Tile sizes and K split of one launch; block_k divides the group size. expand: unpack by
    reading each word once per nibble (a [BLOCK_N, BLOCK_K] gather) instead of a reshape."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int = 4
    num_stages: int = 3
    expand: bool = False
    gemv: bool = False  # block_m rows (<= GEMV_MAX_ROWS) without tl.dot


CONFIG_ENV = "COMPILED_LLM_W4A16_CONFIG"
TINYGEMM_ENV = "COMPILED_LLM_W4A16_TINYGEMM_MAX_ROWS"  # wins over the files; 0 turns it off
DEFAULT_TINYGEMM_MAX_ROWS = 4  # H200: tinygemm wins at 1 and 4 rows, loses at 16
DEQUANT_ENV = "COMPILED_LLM_W4A16_DEQUANT_MIN_ROWS"  # 0 turns dequantize-then-matmul off
# H200 (call 19): at 256 rows the fused kernel took 4.8x bf16's matmul time, while one pass
# over the weight (packed read, bf16 write) costs about one bf16 matmul at that size
DEFAULT_DEQUANT_MIN_ROWS = 256
SHIPPED = Path(__file__).resolve().parents[1] / "configs" / "w4a16.json"


@functools.cache
def load_table(path: str) -> dict[str, dict[str, dict[int, W4A16Config]]]:
    """{GPU name: {"NxK": {token count: config}}} of one file ({} when it is absent)."""
    if not Path(path).is_file():
        return {}
    devices = json.loads(Path(path).read_text())["devices"]
    return {gpu: {shape: {int(m): W4A16Config(**cfg) for m, cfg in by_m.items()}
                  for shape, by_m in shapes.items()} for gpu, shapes in devices.items()}


@functools.cache
def _device_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def lookup(gpu: str, m: int, n: int, k: int) -> W4A16Config | None:
    """The config tuned on `gpu` for an [n, k] weight at the token count nearest m (ties: the
    smaller count), or None; the override file wins over the shipped one."""
    for path in (os.environ.get(CONFIG_ENV), str(SHIPPED)):
        by_m = load_table(path).get(gpu, {}).get(f"{n}x{k}") if path else None
        if by_m:
            return by_m[min(by_m, key=lambda tuned: (abs(tuned - m), tuned))]
    return None


def tuned_w4a16_config(m: int, n: int, k: int, x: torch.Tensor) -> W4A16Config | None:
    """lookup() for x's GPU; None on the CPU."""
    if x.device.type != "cuda":
        return None
    return lookup(_device_name(x.device.index or 0), m, n, k)


@functools.cache
def _tinygemm_rows_table(path: str) -> dict[str, int]:
    if not Path(path).is_file():
        return {}
    return {gpu: int(rows) for gpu, rows in
            json.loads(Path(path).read_text()).get("tinygemm_max_rows", {}).items()}


def _env_rows(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None:
        return None
    if not value.strip().isdigit():
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def use_dequant_mm(x: torch.Tensor) -> bool:
    """Whether x [M, K] runs as dequantize-then-matmul: M >= $COMPILED_LLM_W4A16_DEQUANT_MIN_ROWS
    (default DEFAULT_DEQUANT_MIN_ROWS; 0: never)."""
    rows = _env_rows(DEQUANT_ENV)
    rows = DEFAULT_DEQUANT_MIN_ROWS if rows is None else rows
    return rows > 0 and x.shape[0] >= rows


def tinygemm_max_rows(gpu: str) -> int:
    """The most tokens that run on tinygemm on `gpu`: $COMPILED_LLM_W4A16_TINYGEMM_MAX_ROWS,
    else the override file's entry, the shipped file's, DEFAULT_TINYGEMM_MAX_ROWS."""
    override = _env_rows(TINYGEMM_ENV)
    if override is not None:
        return override
    for path in (os.environ.get(CONFIG_ENV), str(SHIPPED)):
        rows = _tinygemm_rows_table(path).get(gpu) if path else None
        if rows is not None:
            return rows
    return DEFAULT_TINYGEMM_MAX_ROWS


def use_tinygemm(x: torch.Tensor) -> bool:
    """Whether x [M, K] (on CUDA) runs on tinygemm: M <= tinygemm_max_rows for its GPU."""
    return x.shape[0] <= tinygemm_max_rows(_device_name(x.device.index or 0))
