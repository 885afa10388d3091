"""W4A16 path choice per GPU and shape, w4a16_path, from one JSON file (benchmarks/w4a16_tune.py):
$COMPILED_LLM_W4A16_CONFIG, then the shipped configs/w4a16.json. "devices": tiles per "NxK" and
token count; "small_m": the winner of GEMV, MMA tiles and tinygemm up to 4 tokens (forced by
$COMPILED_LLM_W4A16_SMALL_M); else tinygemm up to "tinygemm_max_rows" tokens, the Triton
tiles, dequantize-then-matmul from DEFAULT_DEQUANT_MIN_ROWS (knobs: the *_ENV below)."""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class W4A16Config:
    """Tile sizes and K split of one launch; block_k divides the group size (a GEMV's may also be
    a multiple of it). expand: unpack by reading each word once per nibble (a [BLOCK_N, BLOCK_K]
    gather) instead of a reshape. gemv: the GEMV kernel (block_m is then the token count)."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int = 4
    num_stages: int = 3
    expand: bool = False
    gemv: bool = False


GEMV_MAX_ROWS = 4  # the most token rows the GEMV kernel takes
CONFIG_ENV = "COMPILED_LLM_W4A16_CONFIG"
# "gemv": the GEMV kernel at every token count up to GEMV_MAX_ROWS; "mma": the MMA tiles there;
# "tinygemm": tinygemm there where the layer has its tensors (else the tuned tiles), the files'
# small_m ignored; unset: the files' small_m entry, else tinygemm (an A/B knob)
SMALL_M_ENV = "COMPILED_LLM_W4A16_SMALL_M"
SMALL_M_CHOICES = ("gemv", "mma", "tinygemm")
TINYGEMM_ENV = "COMPILED_LLM_W4A16_TINYGEMM_MAX_ROWS"  # wins over the files; 0 turns it off
DEFAULT_TINYGEMM_MAX_ROWS = 4  # H200: tinygemm wins at 1 and 4 rows, loses at 16
# "0": the MMA tiles unpack 16-bit x's weights to integers as for float32 x (an A/B knob)
PAIRED_ENV = "COMPILED_LLM_W4A16_PAIRED"
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
def device_name(index: int) -> str:
    """The name of CUDA device `index`, the files' GPU key (cached: the op asks every call)."""
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
    return lookup(device_name(x.device.index or 0), m, n, k)


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


def paired_dequant(x: torch.Tensor) -> bool:
    """Whether the MMA tiles take x's weights as 16-bit (q - z) pairs: bf16 or fp16 x, unless
    $COMPILED_LLM_W4A16_PAIRED is 0."""
    paired_dtype = x.dtype in (torch.bfloat16, torch.float16)
    return paired_dtype and os.environ.get(PAIRED_ENV, "1") != "0"


def use_dequant_mm(x: torch.Tensor) -> bool:
    """Whether x [M, K] runs as dequantize-then-matmul: M >= $COMPILED_LLM_W4A16_DEQUANT_MIN_ROWS
    (default DEFAULT_DEQUANT_MIN_ROWS; 0: never)."""
    return _dequant_rows(x.shape[0])


def _dequant_rows(m: int) -> bool:
    rows = _env_rows(DEQUANT_ENV)
    rows = DEFAULT_DEQUANT_MIN_ROWS if rows is None else rows
    return rows > 0 and m >= rows


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
    return x.shape[0] <= tinygemm_max_rows(device_name(x.device.index or 0))


@functools.cache
def _small_m_table(path: str) -> dict[str, dict[str, dict[int, str]]]:
    if not Path(path).is_file():
        return {}
    table = json.loads(Path(path).read_text()).get("small_m", {})
    return {gpu: {shape: {int(m): choice for m, choice in by_m.items()}
                  for shape, by_m in shapes.items()} for gpu, shapes in table.items()}


def small_m_choice(gpu: str, m: int, n: int, k: int) -> str | None:
    """"gemv", "mma" or "tinygemm" for m <= GEMV_MAX_ROWS tokens against an [n, k] weight on `gpu`:
    $COMPILED_LLM_W4A16_SMALL_M, else the files' small_m entry at the nearest tuned token count
    (ties: the smaller; the override file first), else None (today's rule: tinygemm)."""
    if m > GEMV_MAX_ROWS:
        return None
    forced = os.environ.get(SMALL_M_ENV)
    if forced:
        if forced not in SMALL_M_CHOICES:
            raise ValueError(f"{SMALL_M_ENV} must be one of {SMALL_M_CHOICES}, got {forced!r}")
        return forced
    for path in (os.environ.get(CONFIG_ENV), str(SHIPPED)):
        by_m = _small_m_table(path).get(gpu, {}).get(f"{n}x{k}") if path else None
        if by_m:
            return by_m[min(by_m, key=lambda tuned: (abs(tuned - m), tuned))]
    return None


def w4a16_path(gpu: str, m: int, n: int, k: int, tinygemm_ok: bool) -> str:
    """The path of x [m, k] against an [n, k] weight on `gpu`: "gemv" or "mma" (the MMA tiles)
    where small_m_choice says so; "tinygemm" when `tinygemm_ok` (bf16 x, the layer has its
    tensors) up to tinygemm_max_rows, or where the files' small_m says so and
    $COMPILED_LLM_W4A16_TINYGEMM_MAX_ROWS is unset; "dequant" from the dequantize threshold on;
    else "triton" (the tuned tiles, a GEMV's where it won)."""
    choice = small_m_choice(gpu, m, n, k)
    if choice in ("gemv", "mma"):
        return choice
    chosen = choice == "tinygemm" and _env_rows(TINYGEMM_ENV) is None
    if tinygemm_ok and (chosen or m <= tinygemm_max_rows(gpu)):
        return "tinygemm"
    return "dequant" if _dequant_rows(m) else "triton"
