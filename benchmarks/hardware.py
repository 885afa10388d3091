"""Roofline figures measured in the run itself: device copy bandwidth and bf16 GEMM throughput
(CUDA), or small stand-ins on CPU so the same code paths run there."""

from __future__ import annotations

import math
import time

import torch


def best_seconds(fn, reps: int = 3, inner: int = 5) -> float:
    """Best over `reps` of the mean time of `inner` back-to-back calls, after one warm-up."""
    cuda = torch.cuda.is_available()
    fn()
    best = math.inf
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(inner):
            fn()
        if cuda:
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / inner)
    return best


def copy_bandwidth_gbs(nbytes: int | None = None) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written (4 GiB
    on CUDA, 64 MiB of host memory on CPU)."""
    cuda = torch.cuda.is_available()
    nbytes = nbytes or (4 << 30 if cuda else 64 << 20)
    secs = _copy_seconds(nbytes, "cuda" if cuda else "cpu")
    _release()
    return 2 * nbytes / secs / 1e9


def _copy_seconds(nbytes: int, device: str) -> float:
    a = torch.empty(nbytes // 2, dtype=torch.int16, device=device)
    b = torch.empty_like(a)
    return best_seconds(lambda: b.copy_(a))


def _release() -> None:
    """Hand cached blocks back to the device: the engines and peers run in child processes."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def gemm_tflops(n: int | None = None) -> float:
    """Dense matmul throughput in TFLOP/s: an n x n x n bf16 product on CUDA (n = 8192), float32
    on CPU (n = 1024)."""
    cuda = torch.cuda.is_available()
    n = n or (8192 if cuda else 1024)
    secs = _gemm_seconds(n, torch.bfloat16 if cuda else torch.float32, 10 if cuda else 2)
    _release()
    return 2 * n**3 / secs / 1e12


def _gemm_seconds(n: int, dtype: torch.dtype, inner: int) -> float:
    gen = torch.Generator(device="cuda" if torch.cuda.is_available() else "cpu").manual_seed(0)
    a, b = (torch.randn(n, n, dtype=dtype, device=gen.device, generator=gen) for _ in "ab")
    return best_seconds(lambda: a @ b, inner=inner)
