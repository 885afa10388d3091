"""Capturing a ModelRunner's CUDA graphs: piecewise pieces at token counts, full graphs of
pure-decode batches, and full graphs of verify batches (every sequence k drafts + 1 tokens),
each over the step buffers' views that steps of its size fill."""

from __future__ import annotations

import time

import torch

from compiled_llm.attention.forward_context import CUDAGraphKey, ForwardContext, set_forward_context
from compiled_llm.core.request import Request
from compiled_llm.core.scheduler import SchedulerOutput
from compiled_llm.sampling_params import SamplingParams
from compiled_llm.worker.cudagraph import FULL


def capture_piecewise(runner, sizes: list[int]) -> float:
    """Capture each compiled piece at every size (largest first: smaller graphs reuse its
    pool memory); seconds taken."""
    start = time.perf_counter()
    runner.dispatcher.piecewise_sizes = sizes
    for size in reversed(sizes):
        sched = dummy_schedule(size, runner.cache_cfg.block_size, size)
        try:
            runner.run_forward(runner.input_batch.prepare(sched), capturing=True)
        finally:
            runner.release({r.request_id for r, _ in sched.scheduled})
    torch.cuda.synchronize()
    return time.perf_counter() - start


def capture_full(runner, sizes: list[int], query_len: int = 1) -> float:
    """Capture the whole model for batches of `sizes` sequences of query_len tokens each
    (1: decode; k + 1: speculative verification), largest first; seconds taken."""
    start = time.perf_counter()
    batch = runner.input_batch
    if sizes[-1] * query_len > batch.max_tokens or sizes[-1] > batch.max_seqs:
        raise ValueError(f"cudagraph_batch_sizes go up to {sizes[-1]}; the step buffers "
                         f"hold {batch.max_seqs} sequences of {batch.max_tokens} tokens")
    for size in reversed(sizes):
        key = CUDAGraphKey(FULL, size * query_len, query_len)
        ids, positions, ctx = padded_decode(runner, size, query_len, key)
        with set_forward_context(ctx):
            runner.full_graph(ids, positions)
    torch.cuda.synchronize()
    if query_len == 1:
        runner.dispatcher.full_sizes = sizes
    else:
        runner.dispatcher.uniform_sizes = sizes
        runner.dispatcher.uniform_query_len = query_len
    return time.perf_counter() - start


def padded_decode(runner, size: int, query_len: int = 1, key: CUDAGraphKey | None = None):
    """ids, positions and the forward context of a step of `size` padding sequences of
    query_len tokens (valid inputs: every row in the null block); capturing under key."""
    runner.input_batch.pad(size, query_len)
    ids, positions, meta = runner.input_batch.padded_inputs(size, runner.max_model_len,
                                                            query_len)
    ctx = ForwardContext(meta, runner.kv_caches, runner.attn_backend, cudagraph_key=key,
                         capturing=key is not None, kv_scales=runner.kv_scales)
    return ids, positions, ctx


def verify_sizes(full_sizes: list[int], query_len: int, max_tokens: int) -> list[int]:
    """The decode graphs' sequence counts whose verify batches fit the step buffers."""
    return [size for size in full_sizes if size * query_len <= max_tokens]


def dummy_schedule(num_tokens: int, block_size: int, max_len: int) -> SchedulerOutput:
    """Requests of at most max_len tokens, num_tokens in all, whose K/V land in the null block
    (warm-up, profiling and capture)."""
    out = SchedulerOutput()
    for i, start in enumerate(range(0, num_tokens, max_len)):
        count = min(max_len, num_tokens - start)
        req = Request(f"__warmup{i}__", [0] * count,
                      SamplingParams(temperature=0.0, max_tokens=1))
        req.block_ids = [0] * -(-count // block_size)
        out.scheduled.append((req, count))
    return out
