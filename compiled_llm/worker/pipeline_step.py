"""One pipeline stage's forward in a step: receive the stage's input from the previous stage,
run the (compiled) stage, send its output on, outside the compiled graph (and outside any
CUDA graph). A step of several requests runs as micro-batches cut at request boundaries, so
stage s works on micro-batch m+1 while stage s+1 works on micro-batch m (GPipe within a step),
each under its own piecewise graph when the step runs under piecewise graphs."""

from __future__ import annotations

import dataclasses
import os
from collections import Counter

import numpy as np
import torch
import torch.distributed as dist

from compiled_llm.attention.forward_context import (
    CUDAGraphKey,
    current_forward_context,
    set_forward_context,
)
from compiled_llm.attention.metadata import AttentionMetadata
from compiled_llm.distributed.pipeline_parallel import PipelineStage
from compiled_llm.worker.cudagraph import FULL, PIECEWISE, CUDAGraphDispatcher

ENV_MICRO_BATCHES = "COMPILED_LLM_PP_MICRO_BATCHES"  # micro-batches per step; default: stages


def micro_batch_count(num_stages: int) -> int:
    """Micro-batches a step is cut into (at most; never more than its requests):
    $COMPILED_LLM_PP_MICRO_BATCHES, else the number of stages, which keeps every stage busy
    once the pipeline is full. ValueError naming the variable when it is not a count >= 1."""
    spelled = os.environ.get(ENV_MICRO_BATCHES)
    if spelled is None:
        return num_stages
    try:
        count = int(spelled)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"{ENV_MICRO_BATCHES} must be a count >= 1, got {spelled!r}")
    return count


def split_requests(query_start_loc: np.ndarray, count: int) -> list[int]:
    """Request boundaries [0, b_1, ..., B] of min(count, B) micro-batches of about equal token
    counts (each at least one request). A function of the step's inputs alone, so every rank
    cuts a broadcast step the same way."""
    num_seqs = len(query_start_loc) - 1
    count = min(count, num_seqs)
    bounds = [0]
    total = int(query_start_loc[-1])
    for m in range(1, count):
        # the request boundary nearest to an even share of the tokens
        target = total * m / count
        at = int(np.searchsorted(query_start_loc, target))
        if at > 0 and query_start_loc[at] - target > target - query_start_loc[at - 1]:
            at -= 1
        # at least one request in this micro-batch and in each after it
        bounds.append(min(max(at, bounds[-1] + 1), num_seqs - (count - m)))
    bounds.append(num_seqs)
    return bounds


def slice_metadata(attn: AttentionMetadata, first: int, end: int) -> AttentionMetadata:
    """The metadata of requests [first, end) of a step, as a step of their own."""
    starts = attn.query_start_loc_cpu[first:end + 1]
    t0, t1 = int(starts[0]), int(starts[-1])
    seq_lens = attn.seq_lens_cpu[first:end]
    return AttentionMetadata(
        slot_mapping=attn.slot_mapping[t0:t1],
        query_start_loc=attn.query_start_loc[first:end + 1] - t0,
        seq_lens=attn.seq_lens[first:end], block_tables=attn.block_tables[first:end],
        num_actual_tokens=t1 - t0, max_query_len=int((starts[1:] - starts[:-1]).max()),
        max_seq_len=int(seq_lens.max()), query_start_loc_cpu=starts - t0, seq_lens_cpu=seq_lens)


class StageForward:
    """The runner's forward for one stage. Every rank cuts a step into the same micro-batches
    and runs them in the same order, so each send meets its receive; `micro_batches` is the
    driver's count (followers take it from the step's broadcast). `counts` tallies steps,
    micro-batches, receives and sends."""

    def __init__(self, inner, stage: PipelineStage, hidden_size: int, dtype: torch.dtype,
                 device: torch.device, dispatcher: CUDAGraphDispatcher | None = None) -> None:
        self.inner, self.stage = inner, stage
        self.hidden_size, self.dtype, self.device = hidden_size, dtype, device
        self.dispatcher = dispatcher  # its piecewise graphs run micro-batches too
        self.micro_batches = micro_batch_count(stage.num_stages)
        self.counts: Counter[str] = Counter()
        self.release = getattr(inner, "release", None)  # the runner's shutdown calls it

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The stage's output for one step (see pipeline_parallel.stage_class)."""
        ctx = current_forward_context()
        attn = None if ctx is None else ctx.attn_metadata
        key = None if ctx is None else ctx.cudagraph_key
        self.counts["steps"] += 1
        # a full graph (or a capture) is one piece: the step runs whole
        if (attn is None or ctx.capturing or (key is not None and key.mode == FULL)
                or self.micro_batches < 2 or attn.num_seqs < 2):
            return self._whole(input_ids, positions)
        bounds = split_requests(attn.query_start_loc_cpu.numpy(), self.micro_batches)
        return self._micro(input_ids, positions, ctx, bounds)

    def _buffer(self, rows: int) -> torch.Tensor:
        return torch.empty((rows, 2, self.hidden_size), dtype=self.dtype, device=self.device)

    def _whole(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The step as one micro-batch (all T rows, padding included)."""
        self.counts["micro_batches"] += 1
        stage_input = input_ids
        if not self.stage.is_first:
            stage_input = self._buffer(len(input_ids))
            dist.recv(stage_input, self.stage.prev_rank)
            self.counts["recv"] += 1
        out = self.inner(stage_input, positions)
        if not self.stage.is_last:
            dist.send(out.contiguous(), self.stage.next_rank)
            self.counts["send"] += 1
        return out

    def _micro(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx,
               bounds: list[int]) -> torch.Tensor:
        """The step as micro-batches: every receive is posted first (micro-batch m+1 arrives
        while m runs), every send is asynchronous (m+1 runs while m travels); the sends are
        waited for at the end, when the next stage has taken them."""
        starts, stage = ctx.attn_metadata.query_start_loc_cpu.tolist(), self.stage
        spans = [(starts[a], starts[b]) for a, b in zip(bounds, bounds[1:])]
        received = []
        if not stage.is_first:
            for m, (t0, t1) in enumerate(spans):  # a tag per micro-batch: no mismatched pairs
                buffer = self._buffer(t1 - t0)
                received.append((buffer, dist.irecv(buffer, stage.prev_rank, tag=m)))
            self.counts["recv"] += len(spans)
        outs, sends = [], []
        for m, (t0, t1) in enumerate(spans):
            if stage.is_first:
                stage_input = input_ids[t0:t1]
            else:
                stage_input, work = received[m]
                work.wait()
            out = self._run(stage_input, positions[t0:t1], ctx, bounds[m], bounds[m + 1])
            if not stage.is_last:  # out is kept alive (in outs) until its send is done
                sends.append(dist.isend(out, stage.next_rank, tag=m))
            outs.append(out)
        for work in sends:
            work.wait()
        self.counts["send"] += len(sends)
        self.counts["micro_batches"] += len(spans)
        return torch.cat(outs)

    def _run(self, stage_input: torch.Tensor, positions: torch.Tensor, ctx, first: int,
             end: int) -> torch.Tensor:
        """One micro-batch (requests [first, end)) as a step of its own: under the smallest
        piecewise graph that holds it when the step itself runs under piecewise graphs, its
        rows padded as the input batch pads (token 0 at position 0, attention writes only
        the real rows); the graph's output buffer is copied, the next replay reuses it."""
        rows = len(positions)
        key = ctx.cudagraph_key
        if key is not None:
            size = next(s for s in self.dispatcher.piecewise_sizes if s >= rows)
            key = CUDAGraphKey(PIECEWISE, size)
            stage_input, positions = _padded(stage_input, size), _padded(positions, size)
        sub = dataclasses.replace(ctx, attn_metadata=slice_metadata(ctx.attn_metadata, first,
                                                                    end), cudagraph_key=key)
        with set_forward_context(sub):
            out = self.inner(stage_input, positions)
        return out.contiguous() if key is None else out[:rows].clone()


def _padded(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x with zero rows after its own, `rows` in all."""
    if len(x) == rows:
        return x
    out = x.new_zeros((rows, *x.shape[1:]))
    out[:len(x)] = x
    return out


def wrap_stage_forward(runner) -> None:
    """Put StageForward around a stage runner's forwards, the compiled one and the full CUDA
    graph (no-op for a model not split): the graph holds the stage's layers, the transfers
    stay outside it."""
    stage = getattr(runner.model, "pipeline_stage", None)
    if stage is None:
        return
    shape = (runner.model.config.hidden_size, runner.dtype, runner.device, runner.dispatcher)
    runner.forward_fn = StageForward(runner.forward_fn, stage, *shape)
    if runner.full_graph is not None:
        runner.full_graph = StageForward(runner.full_graph, stage, *shape)
