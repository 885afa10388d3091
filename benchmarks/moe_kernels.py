"""The fused MoE kernel (issue 18) at one layer's shape (default Qwen3-30B-A3B: 128 experts, top-8,
hidden 2048, expert intermediate 768, bf16) against the per-expert torch loop and against
`torch._grouped_mm` where this torch has it, as a table of milliseconds over token counts
("triton ms": the tuned config where moe/configs has the shape, else the built-in table).

    python -m benchmarks.moe_kernels --tokens 1 8 64 256 1024 4096 --json /tmp/moe_kernels.json
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from compiled_llm.moe import fused_moe_reference
from compiled_llm.moe.triton_moe import fused_moe_triton, moe_gemm_config


def grouped_mm_moe(hidden, w13, w2, topk_weights, topk_ids):
    """The same MoE on torch._grouped_mm: rows sorted by expert, two grouped GEMMs, top-k sum."""
    num_tokens, top_k = topk_ids.shape
    flat = topk_ids.flatten()
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(w13.shape[0], dtype=torch.int32, device=hidden.device)
    counts.scatter_add_(0, flat.int(), torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    rows = hidden[order // top_k]
    gate, up = torch._grouped_mm(rows, w13.transpose(1, 2), offs=offs).chunk(2, dim=-1)
    down = torch._grouped_mm(F.silu(gate) * up, w2.transpose(1, 2), offs=offs)
    down = down * topk_weights.flatten()[order, None].to(down.dtype)
    out = torch.zeros(num_tokens * top_k, hidden.shape[1], dtype=down.dtype, device=down.device)
    out[order] = down
    return out.view(num_tokens, top_k, -1).sum(1)


def time_ms(fn, args, iters: int, graph: bool = False) -> float:
    """Mean milliseconds of iters calls after 3 warm-ups, timed by CUDA events; graph: as
    replays of one CUDA graph of the iters calls (device time alone, as in a captured step)."""
    for _ in range(3):
        fn(*args)
    run = lambda: [fn(*args) for _ in range(iters)]  # noqa: E731
    if graph:
        cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cuda_graph):
            run()
        run = cuda_graph.replay
        run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def inputs(num_tokens: int, args):
    """Random bf16 hidden and experts, softmax top-k routing of random logits."""
    dev, dtype = "cuda", torch.bfloat16
    hidden = torch.randn(num_tokens, args.hidden, device=dev, dtype=dtype)
    w13 = torch.randn(args.experts, 2 * args.inter, args.hidden, device=dev, dtype=dtype) * 0.02
    w2 = torch.randn(args.experts, args.hidden, args.inter, device=dev, dtype=dtype) * 0.02
    weights, ids = torch.randn(num_tokens, args.experts, device=dev).softmax(-1).topk(args.top_k)
    return hidden, w13, w2, weights, ids


def row(num_tokens: int, args) -> dict:
    """One token count: ms of each implementation and the Triton kernel's error."""
    moe_args = inputs(num_tokens, args)
    ref = fused_moe_reference(*moe_args)
    table = moe_gemm_config(num_tokens, args.top_k, args.experts, torch.bfloat16)
    out = {"tokens": num_tokens,
           "triton ms": time_ms(fused_moe_triton, moe_args, args.iters),
           "triton graph ms": time_ms(fused_moe_triton, moe_args, args.iters, graph=True),
           "triton, table config graph ms": time_ms(
               lambda *a: fused_moe_triton(*a, config=table), moe_args, args.iters, graph=True),
           "per-expert loop ms": time_ms(fused_moe_reference, moe_args, max(3, args.iters // 10)),
           "triton rel err": float((fused_moe_triton(*moe_args).float() - ref.float()).norm()
                                   / ref.float().norm())}
    try:
        out["grouped_mm ms"] = time_ms(grouped_mm_moe, moe_args, args.iters)
    except (AttributeError, RuntimeError) as e:  # absent, or not for this GPU/layout
        out["grouped_mm ms"] = f"n/a: {str(e).splitlines()[0][:60]}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 64, 256, 1024, 4096])
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = [row(num_tokens, args) for num_tokens in args.tokens]
    for r in rows:
        print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in r.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
