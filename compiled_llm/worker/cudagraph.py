"""CUDA graphs for pure-decode steps: one whole-model graph per padded batch size.

Every graph reads the runner's persistent step buffers (views of the size it was captured at),
so a step writes its rows there, padded to the captured size on the host (padding rows write
only the null block), replays, and reads the first rows of the graph's output. No copies into
separate static buffers. All graphs share one memory pool.
"""

from __future__ import annotations

import logging
import time
import weakref

import torch

from compiled_llm.attention import AttentionMetadata
from compiled_llm.attention.forward_context import ForwardContext, set_forward_context
from compiled_llm.compile.counters import counters
from compiled_llm.worker.input_batch import attention_metadata, fill_padding

logger = logging.getLogger(__name__)


def default_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, 16, 24, 32, then every 16 up to max_num_seqs (and max_num_seqs itself):
    fine steps where padding costs most, few graphs overall so capture stays short."""
    sizes = [s for s in (1, 2, 4, 8, 16, 24, 32) if s <= max_num_seqs]
    sizes += list(range(48, max_num_seqs + 1, 16))
    return sorted({*sizes, max_num_seqs})


class DecodeGraphs:
    def __init__(self, runner, sizes: list[int], max_len: int) -> None:
        # a proxy: the runner holds these graphs, and a cycle would keep the runner (and its
        # KV cache) alive after the engine is dropped, until the garbage collector runs
        self.runner, self.sizes = weakref.proxy(runner), sorted(set(sizes))
        self.bufs = runner.buffers
        if self.sizes[-1] > min(self.bufs.max_seqs, self.bufs.max_tokens):
            raise ValueError(f"cudagraph_batch_sizes go up to {self.sizes[-1]}; the step "
                             f"buffers hold {self.bufs.max_seqs} sequences")
        self.max_len = max_len
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = torch.cuda.graph_pool_handle()

    def _inputs(self, size: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """The buffer views a step of `size` padded sequences fills (see Layout)."""
        v = self.bufs.views(size, size)
        bs = self.runner.cache_cfg.block_size
        return v.dev["ids"], v.dev["pos"], attention_metadata(v, size, size, 1, self.max_len, bs)

    def _fill_padding(self) -> None:
        """Valid inputs for every size before capture: all rows padding (null slot, one token
        of context, the zero table row)."""
        fill_padding(self.bufs, self.sizes[-1])
        torch.cuda.synchronize()

    @torch.inference_mode()
    def capture(self) -> float:
        """Capture every size, largest first so smaller graphs reuse the pool; seconds taken."""
        t0 = time.perf_counter()
        r = self.runner
        self._fill_padding()
        for size in reversed(self.sizes):
            ids, pos, meta = self._inputs(size)
            ctx = ForwardContext(meta, r.kv_caches, r.attn_backend)
            with set_forward_context(ctx):
                r.forward_fn(ids, pos)  # warm: lazy init outside the graph
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=self.pool):
                    self.outputs[size] = r.forward_fn(ids, pos)
            self.graphs[size] = g
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def size_for(self, num_seqs: int, max_query_len: int) -> int | None:
        """The captured size for a pure-decode batch, or None when it must run without."""
        if max_query_len != 1 or num_seqs > self.sizes[-1]:
            return None
        return next(s for s in self.sizes if s >= num_seqs)

    def run(self, num_seqs: int, size: int) -> torch.Tensor:
        """Replay the graph of `size` over the inputs the step wrote into the buffers (padded
        to `size`); returns hidden [num_seqs, hidden]."""
        self.graphs[size].replay()
        counters.full_graph_replays += 1
        return self.outputs[size][:num_seqs]


@torch.inference_mode()  # buffers and captures made as inference tensors, as steps run
def capture_all(runner, max_num_seqs: int) -> dict[str, float]:
    """Capture what cudagraph_mode asks for; returns seconds per kind."""
    cfg, secs = runner.compile_cfg, {}
    if cfg.cudagraph_mode in ("piecewise", "full_and_piecewise") and cfg.mode == "backend":
        secs["piecewise"] = _capture_piecewise(runner, cfg.piecewise_max_tokens)
    if cfg.cudagraph_mode in ("full", "full_and_piecewise"):
        sizes = cfg.cudagraph_batch_sizes or default_sizes(max_num_seqs)
        graphs = DecodeGraphs(runner, sizes, runner.max_model_len)
        secs["full"] = graphs.capture()
        runner.decode_graphs = graphs
    logger.info("CUDA graph capture: %s", secs)
    runner.cudagraph_capture_seconds = sum(secs.values())
    return secs


def _capture_piecewise(runner, max_tokens: int) -> float:
    from compiled_llm.compile.piecewise import piecewise_sizes
    from compiled_llm.worker.model_runner import dummy_schedule

    t0 = time.perf_counter()
    sizes = piecewise_sizes(min(max_tokens, runner.max_model_len - 1))
    runner.piecewise_sizes = sizes
    bs = runner.cache_cfg.block_size
    for size in reversed(sizes):  # largest first: smaller graphs reuse its pool memory
        sched = dummy_schedule(size, bs, size)
        try:
            with torch.inference_mode():
                runner.run_forward(runner.prepare(sched), capturing=True)
        finally:
            runner.release({r.request_id for r, _ in sched.scheduled})
    torch.cuda.synchronize()
    return time.perf_counter() - t0
