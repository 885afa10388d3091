"""AllReduceRMSNormFusionPass on a graph holding a functional all-reduce, under a gloo process
group of 2 CPU processes: one match per site, and the same numbers as the unfused graph."""

from __future__ import annotations

import socket

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.multiprocessing as mp

from compiled_llm.models.layers import rms_norm
from compiled_llm.passes import PassConfig
from tests.passes.helpers import capture_run


def _tp_block(x, r, w1, w2):
    h0 = funcol.all_reduce(x, "sum", dist.group.WORLD)  # e.g. a vocab-parallel embedding
    a = rms_norm(h0, w1, 1e-6)
    h = funcol.all_reduce(a * 3, "sum", dist.group.WORLD) + r  # row-parallel proj + residual
    return rms_norm(h, w2, 1e-6), h


def _worker(rank: int, port: int, results) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    try:
        g = torch.Generator().manual_seed(rank)
        args = [torch.randn(6, 32, generator=g), torch.randn(6, 32), torch.randn(32),
                torch.randn(32)]
        ref = _tp_block(*args)
        out, before, after, m = capture_run(_tp_block, args, PassConfig(inline_fused_ops=False))
        results.put((rank, m.matches("AllReduceRMSNormFusionPass"),
                     before["_c10d_functional.all_reduce"], after["_c10d_functional.all_reduce"],
                     after["compiled_llm.all_reduce_rms_norm"],
                     after["compiled_llm.all_reduce_fused_add_rms_norm"],
                     all(torch.allclose(o, e, rtol=1e-5, atol=1e-5) for o, e in zip(out, ref))))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_allreduce_rms_norm_fusion_under_gloo():
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    mp.start_processes(_worker, args=(_free_port(), results), nprocs=2, start_method="spawn")
    rows = sorted(results.get(timeout=60) for _ in range(2))
    for _, matches, ar_before, ar_after, plain, with_res, close in rows:
        assert (matches, ar_before, ar_after, plain, with_res) == (2, 2, 0, 1, 1)
        assert close
