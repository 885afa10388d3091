"""CUDA graphs for pure-decode steps: one whole-model graph per padded batch size.

Inputs and attention metadata live in static buffers that every graph reads; a step copies
its rows in, pads to the next captured size (padding writes only the null block), replays,
and reads the first rows of the graph's output. All graphs share one memory pool.
"""

from __future__ import annotations

import logging
import time

import torch

from compiled_llm.attention import AttentionMetadata
from compiled_llm.compile.counters import counters
from compiled_llm.forward_context import ForwardContext, set_forward_context

logger = logging.getLogger(__name__)


def default_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, 16, 24, 32, then every 16 up to max_num_seqs (and max_num_seqs itself):
    fine steps where padding costs most, few graphs overall so capture stays short."""
    sizes = [s for s in (1, 2, 4, 8, 16, 24, 32) if s <= max_num_seqs]
    sizes += list(range(48, max_num_seqs + 1, 16))
    return sorted({*sizes, max_num_seqs})


class DecodeGraphs:
    def __init__(self, runner, sizes: list[int], max_blocks: int, max_len: int) -> None:
        self.runner, self.sizes = runner, sorted(set(sizes))
        n, dev = self.sizes[-1], runner.device
        i32 = dict(dtype=torch.int32, device=dev)
        self.input_ids = torch.zeros(n, dtype=torch.long, device=dev)
        self.positions = torch.zeros(n, dtype=torch.long, device=dev)
        self.slot_mapping = torch.zeros(n, dtype=torch.long, device=dev)
        self.seq_lens = torch.ones(n, **i32)
        self.query_start_loc = torch.arange(n + 1, **i32)
        self.block_tables = torch.zeros(n, max_blocks, **i32)
        self.max_len = max_len
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = torch.cuda.graph_pool_handle()

    def _metadata(self, size: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:size], query_start_loc=self.query_start_loc[:size + 1],
            seq_lens=self.seq_lens[:size], block_tables=self.block_tables[:size],
            num_actual_tokens=size, max_query_len=1, max_seq_len=self.max_len,
            query_start_loc_cpu=torch.arange(size + 1, dtype=torch.int32),
            seq_lens_cpu=torch.ones(size, dtype=torch.int32))

    @torch.inference_mode()
    def capture(self) -> float:
        """Capture every size, largest first so smaller graphs reuse the pool; seconds taken."""
        t0 = time.perf_counter()
        r = self.runner
        for size in reversed(self.sizes):
            ctx = ForwardContext(self._metadata(size), r.kv_caches, r.attn_backend)
            args = (self.input_ids[:size], self.positions[:size])
            with set_forward_context(ctx):
                r.forward_fn(*args)  # warm: lazy init outside the graph
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=self.pool):
                    self.outputs[size] = r.forward_fn(*args)
            self.graphs[size] = g
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def size_for(self, meta: AttentionMetadata) -> int | None:
        """The captured size for a pure-decode batch, or None when it must run without."""
        if meta.max_query_len != 1 or meta.num_seqs > self.sizes[-1]:
            return None
        return next(s for s in self.sizes if s >= meta.num_seqs)

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
            size: int) -> torch.Tensor:
        """Copy the step into the static buffers, pad, replay; returns hidden [B, hidden]."""
        b = meta.num_seqs
        self.input_ids[:b].copy_(input_ids, non_blocking=True)
        self.positions[:b].copy_(positions, non_blocking=True)
        self.slot_mapping[:b].copy_(meta.slot_mapping, non_blocking=True)
        self.seq_lens[:b].copy_(meta.seq_lens, non_blocking=True)
        width = meta.block_tables.shape[1]
        self.block_tables[:b, :width].copy_(meta.block_tables, non_blocking=True)
        if b < size:  # padding rows: null slot, one null token of context
            self.slot_mapping[b:size].zero_()
            self.seq_lens[b:size].fill_(1)
            self.block_tables[b:size].zero_()
        self.graphs[size].replay()
        counters.full_graph_replays += 1
        return self.outputs[size][:b]


@torch.inference_mode()  # buffers and captures made as inference tensors, as steps run
def capture_all(runner, max_num_seqs: int) -> dict[str, float]:
    """Capture what cudagraph_mode asks for; returns seconds per kind."""
    cfg, secs = runner.compile_cfg, {}
    if cfg.cudagraph_mode in ("piecewise", "full_and_piecewise") and cfg.mode == "backend":
        secs["piecewise"] = _capture_piecewise(runner, cfg.piecewise_max_tokens)
    if cfg.cudagraph_mode in ("full", "full_and_piecewise"):
        sizes = cfg.cudagraph_batch_sizes or default_sizes(max_num_seqs)
        graphs = DecodeGraphs(runner, sizes, runner.max_blocks_per_seq, runner.max_model_len)
        secs["full"] = graphs.capture()
        runner.decode_graphs = graphs
    logger.info("CUDA graph capture: %s", secs)
    runner.cudagraph_capture_seconds = sum(secs.values())
    return secs


def _capture_piecewise(runner, max_tokens: int) -> float:
    from compiled_llm.compile.piecewise import piecewise_sizes
    from compiled_llm.input_batch import build_step_inputs
    from compiled_llm.model_runner import dummy_schedule

    t0 = time.perf_counter()
    sizes = piecewise_sizes(min(max_tokens, runner.max_model_len - 1))
    runner.piecewise_sizes = sizes
    bs = runner.cache_cfg.block_size
    for size in reversed(sizes):  # largest first: smaller graphs reuse its pool memory
        inputs = build_step_inputs(dummy_schedule(size, bs, size), bs, runner.device)
        with torch.inference_mode():
            runner.run_forward(inputs, capturing=True)
    torch.cuda.synchronize()
    return time.perf_counter() - t0
