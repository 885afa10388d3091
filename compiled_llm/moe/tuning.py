"""Tuned tile configs of the fused MoE kernel, per layer shape, dtype and GPU: JSON files that
map a token count to the MoeGemmConfig timed fastest there (benchmarks/moe_tune.py writes
them), read from $COMPILED_LLM_MOE_CONFIG_DIR first, then from compiled_llm/moe/configs/ (the
shipped ones). A shape without a file keeps the built-in table (triton_moe.CONFIG_TABLE)."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import torch

from compiled_llm.moe.kernels import MoeGemmConfig

CONFIG_DIR_ENV = "COMPILED_LLM_MOE_CONFIG_DIR"
SHIPPED_DIR = Path(__file__).with_name("configs")
_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def config_file_name(num_experts: int, n: int, k: int, dtype: torch.dtype,
                     device_name: str) -> str:
    """The file of one shape: E experts, w13 of [E, N, K] (N = 2 x the expert width)."""
    device = device_name.replace(" ", "_").replace("/", "_")
    return f"E={num_experts},N={n},K={k},device={device},dtype={_DTYPE_NAMES[dtype]}.json"


def search_dirs() -> list[Path]:
    """Where tuned files are looked for, in order."""
    override = os.environ.get(CONFIG_DIR_ENV)
    return ([Path(override)] if override else []) + [SHIPPED_DIR]


@functools.cache
def load_tuned(name: str) -> dict[int, MoeGemmConfig] | None:
    """{token count: config} of the first file called `name`, or None when there is none."""
    for directory in search_dirs():
        path = directory / name
        if path.is_file():
            table = json.loads(path.read_text())["configs"]
            return {int(tokens): MoeGemmConfig(**cfg) for tokens, cfg in table.items()}
    return None


@functools.cache
def _device_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def tuned_config(num_tokens: int, w13: torch.Tensor) -> MoeGemmConfig | None:
    """The tuned config at the token count nearest num_tokens for w13's shape, dtype and
    GPU, or None (CPU, or no file for it)."""
    if w13.device.type != "cuda" or w13.dtype not in _DTYPE_NAMES:
        return None
    num_experts, n, k = w13.shape
    name = config_file_name(num_experts, n, k, w13.dtype, _device_name(w13.device.index or 0))
    table = load_tuned(name)
    return nearest(table, num_tokens) if table else None


def nearest(table: dict[int, MoeGemmConfig], num_tokens: int) -> MoeGemmConfig:
    """The config tuned at the token count nearest num_tokens (ties: the smaller count)."""
    return table[min(table, key=lambda tokens: (abs(tokens - num_tokens), tokens))]


def save_tuned(path: Path, configs: dict[int, MoeGemmConfig], meta: dict) -> None:
    """Write a tuned file: {"configs": {tokens: config fields}, "meta": what was timed}."""
    import dataclasses

    payload = {"meta": meta,
               "configs": {str(t): dataclasses.asdict(c) for t, c in sorted(configs.items())}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1) + "\n")
