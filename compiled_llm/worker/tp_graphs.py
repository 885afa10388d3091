"""CUDA graphs across ranks: the driver's capture plan sent to the followers (NCCL collectives
inside captured graphs must be captured by every rank, same sizes, same order), the check that
every rank captured the same sizes, and a follower's full-graph step: the broadcast inputs
written into the persistent buffers its own graph was captured over."""

from __future__ import annotations

import zlib

import torch
import torch.distributed as dist

from compiled_llm.attention.forward_context import CUDAGraphKey
from compiled_llm.distributed.parallel_state import TPGroup
from compiled_llm.worker.cudagraph import FULL, PIECEWISE
from compiled_llm.worker.input_batch import StepInputs
from compiled_llm.worker.model_runner import ModelRunner

GRAPH_MODES = (None, PIECEWISE, FULL)  # a step header's graph mode, by index
Plan = tuple[list[int], list[int]]  # (piecewise sizes, full sizes)


def send_plan(tp: TPGroup, plan: Plan) -> None:
    """The driver: the sizes to capture, after the header that counts them."""
    if plan[0] or plan[1]:
        dist.broadcast(torch.tensor([*plan[0], *plan[1]], dtype=torch.int64), 0,
                       group=tp.cpu_group)


def receive_plan(tp: TPGroup, num_piecewise: int, num_full: int) -> Plan:
    """A follower: the driver's sizes, as send_plan sent them."""
    if not num_piecewise + num_full:
        return [], []
    sizes = torch.empty(num_piecewise + num_full, dtype=torch.int64)
    dist.broadcast(sizes, 0, group=tp.cpu_group)
    sizes = sizes.tolist()
    return sizes[:num_piecewise], sizes[num_piecewise:]


def captured_sizes(runner: ModelRunner) -> Plan:
    """The sizes whose graphs this rank's runner holds (its dispatcher's)."""
    return list(runner.dispatcher.piecewise_sizes), list(runner.dispatcher.full_sizes)


def agree_graphs(tp: TPGroup, runner: ModelRunner) -> bool:
    """Whether every rank captured the same sizes (a collective: every rank calls it once
    its capture is done)."""
    digest = zlib.crc32(repr(captured_sizes(runner)).encode())
    both = torch.tensor([digest, -digest], dtype=torch.int64)
    dist.all_reduce(both, dist.ReduceOp.MAX, group=tp.cpu_group)
    return int(both[0]) == -int(both[1])  # the largest digest is also the smallest


def graph_fields(inputs: StepInputs) -> dict[str, int]:
    """A step header's graph fields: the mode index and padded size the driver runs."""
    key = inputs.cudagraph_key
    return {} if key is None else {"graph_mode": GRAPH_MODES.index(key.mode),
                                   "graph_size": key.num_tokens}


def follow_graph(runner: ModelRunner, sizes: dict[str, int], inputs: StepInputs) -> None:
    """Run the follower's step under the driver's graph: the key, and for a full graph the
    step written into the views it was captured over (attention reads them in the graph)."""
    mode = GRAPH_MODES[sizes["graph_mode"]]
    if mode is None:
        return
    inputs.cudagraph_key = CUDAGraphKey(mode, sizes["graph_size"])
    if mode == FULL:
        inputs.input_ids, inputs.positions = fill_full_views(runner, sizes, inputs)


def fill_full_views(runner: ModelRunner, sizes: dict[str, int],
                    inputs: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Write a broadcast pure-decode step into the input batch's views of its padded size,
    padding as the driver's input batch pads (null slot, one token of context, the zero
    table row); returns the views' ids and positions."""
    size, tokens, seqs = sizes["graph_size"], sizes["num_tokens"], sizes["seqs"]
    dev = runner.input_batch.views(size, size).dev
    attn = inputs.attn
    dev["ids"].copy_(inputs.input_ids)
    dev["pos"].copy_(inputs.positions)
    dev["slots"][:tokens].copy_(attn.slot_mapping)
    dev["slots"][tokens:].zero_()
    dev["query_start_loc"][:seqs + 1].copy_(attn.query_start_loc)
    dev["query_start_loc"][seqs + 1:].copy_(torch.arange(
        tokens + 1, tokens + 1 + size - seqs, dtype=torch.int32, device=runner.device))
    dev["seq_lens"][:seqs].copy_(attn.seq_lens)
    dev["seq_lens"][seqs:].fill_(1)
    # the graph's decode reads this order: the driver's (longest first), sorted here
    dev["order"].copy_(torch.sort(dev["seq_lens"], descending=True, stable=True).indices)
    tables = dev["block_tables"]
    tables[:seqs, :attn.block_tables.shape[1]].copy_(attn.block_tables)
    tables[seqs:].zero_()
    return dev["ids"], dev["pos"]
