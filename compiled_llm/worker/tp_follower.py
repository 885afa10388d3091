"""Steps across ranks (tensor or pipeline parallel): the driver (rank 0) runs the engine's steps
and broadcasts each one's inputs (a header of sizes, then one int64 tensor); followers run the
same forward and LM-head calls so collectives meet, and only the driver samples. At start-up
the ranks agree on the KV pool (the fewest blocks any holds) and capture the driver's CUDA
graphs together (worker/tp_graphs.py)."""

from __future__ import annotations

import logging

import numpy as np
import torch
import torch.distributed as dist

from compiled_llm.attention.metadata import AttentionMetadata
from compiled_llm.distributed.parallel_state import TPGroup
from compiled_llm.worker.input_batch import StepInputs
from compiled_llm.worker.kv_budget import budget_blocks
from compiled_llm.worker.model_runner import ModelRunner
from compiled_llm.worker.tp_graphs import (
    Plan,
    agree_graphs,
    captured_sizes,
    follow_graph,
    graph_fields,
    receive_plan,
    send_plan,
)

logger = logging.getLogger(__name__)
STEP, STOP, BLOCKS, CAPTURE = 0, 1, 2, 3
# header fields, in order
FIELDS = ("kind", "padded", "slots", "seqs", "width", "num_tokens", "max_query_len",
          "max_seq_len", "samples", "prompt_calls", "prompt_rows", "num_blocks", "micro_batches",
          "graph_mode", "graph_size", "max_model_len", "capture_piecewise", "capture_full",
          "calibrate_kv")


def _header(values: dict[str, int]) -> torch.Tensor:
    return torch.tensor([values.get(name, 0) for name in FIELDS], dtype=torch.int64)


class StepBroadcaster:
    """The driver's hook (ModelRunner.step_hook): sends each step to the followers."""

    def __init__(self, tp: TPGroup, runner: ModelRunner) -> None:
        self.tp, self.runner = tp, runner

    def __call__(self, inputs: StepInputs) -> None:
        """Broadcast one step's inputs (called after they are on the device)."""
        header, payload = step_message(self.runner, inputs)
        dist.broadcast(header, 0, group=self.tp.cpu_group)
        dist.broadcast(payload, 0, group=self.tp.device_group)

    def agree_blocks(self, blocks: int) -> int:
        """The KV pool's size on every rank: the fewest blocks that any rank's budget holds
        (pipeline stages hold different layers). ValueError if that is under 2."""
        dist.broadcast(_header({"kind": BLOCKS}), 0, group=self.tp.cpu_group)
        return _min_blocks(self.tp, blocks)

    def capture(self, plan: Plan) -> None:
        """Capture the plan's CUDA graphs here and on every follower, in lockstep (their
        NCCL collectives are captured too), then check that every rank holds the same sizes:
        RuntimeError if not."""
        runner = self.runner
        dist.broadcast(_header({
            "kind": CAPTURE, "max_model_len": runner.max_model_len,
            "num_blocks": runner.kv_caches[0].shape[1] if runner.kv_caches else 0,
            "capture_piecewise": len(plan[0]), "capture_full": len(plan[1])}),
            0, group=self.tp.cpu_group)
        send_plan(self.tp, plan)
        runner.capture_cudagraphs(plan)
        if not agree_graphs(self.tp, runner):
            raise RuntimeError(f"CUDA graphs: the ranks captured different sizes (the "
                               f"driver's: {captured_sizes(runner)})")

    def stop(self) -> None:
        """Tell the followers to leave their loop."""
        dist.broadcast(_header({"kind": STOP}), 0, group=self.tp.cpu_group)


def step_message(runner: ModelRunner, inputs: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """A step's header (host) and its one int64 payload (device), as the driver sends them."""
    attn = inputs.attn
    prompt = [np.asarray(rows.rows, dtype=np.int64) for rows in inputs.prompt_rows]
    samples = len(inputs.sample_reqs)
    header = _header({
        "kind": STEP, "padded": len(inputs.input_ids), "slots": len(attn.slot_mapping),
        "seqs": len(attn.seq_lens), "width": attn.block_tables.shape[1],
        "num_tokens": inputs.num_tokens, "max_query_len": attn.max_query_len,
        "max_seq_len": attn.max_seq_len, "samples": samples, "prompt_calls": len(prompt),
        "prompt_rows": sum(len(rows) for rows in prompt),
        "num_blocks": runner.kv_caches[0].shape[1] if runner.kv_caches else 0,
        # a pipeline stage's micro-batches: every rank must cut the step alike
        "micro_batches": getattr(runner.forward_fn, "micro_batches", 1),
        "calibrate_kv": int(inputs.calibrate_kv), **graph_fields(inputs)})
    device = runner.device
    parts = [inputs.input_ids, inputs.positions, attn.slot_mapping, attn.query_start_loc,
             attn.seq_lens, attn.block_tables.reshape(-1),
             inputs.sample_rows[:samples] if samples else None,
             torch.tensor([len(rows) for rows in prompt], dtype=torch.int64, device=device),
             torch.from_numpy(np.concatenate(prompt)).to(device) if prompt else None]
    return header, torch.cat([part.to(torch.int64) for part in parts if part is not None])


def payload_lengths(sizes: dict[str, int]) -> list[int]:
    """The lengths of a step payload's parts, from its header (see step_message)."""
    seqs = sizes["seqs"]
    return [sizes["padded"], sizes["padded"], sizes["slots"], seqs + 1, seqs,
            seqs * sizes["width"], sizes["samples"], sizes["prompt_calls"], sizes["prompt_rows"]]


def _min_blocks(tp: TPGroup, blocks: int) -> int:
    agreed = torch.tensor([blocks], dtype=torch.int64)
    dist.all_reduce(agreed, dist.ReduceOp.MIN, group=tp.cpu_group)
    if agreed.item() < 2:
        raise ValueError("the KV cache budget of some rank holds fewer than 2 blocks")
    return int(agreed.item())


def _follower_blocks(tp: TPGroup, runner: ModelRunner) -> None:
    try:
        blocks = budget_blocks(runner)
    except ValueError:  # too few: the driver raises it from the agreed minimum
        blocks = 0
    _min_blocks(tp, blocks)


def _follower_capture(tp: TPGroup, runner: ModelRunner, sizes: dict[str, int]) -> None:
    plan = receive_plan(tp, sizes["capture_piecewise"], sizes["capture_full"])
    # the driver's settled length: the same buffers' widths, the same piecewise sizes
    runner.set_max_model_len(sizes["max_model_len"])
    _allocate(runner, sizes["num_blocks"])  # graphs read the cache at its addresses
    runner.capture_cudagraphs(plan)
    agree_graphs(tp, runner)


def _allocate(runner: ModelRunner, num_blocks: int) -> None:
    if num_blocks and (not runner.kv_caches or runner.kv_caches[0].shape[1] != num_blocks):
        runner.kv_caches = []
        runner.allocate_kv_cache(num_blocks)


def _receive(tp: TPGroup, runner: ModelRunner) -> tuple[dict[str, int], list[torch.Tensor]]:
    header = _header({})
    dist.broadcast(header, 0, group=tp.cpu_group)
    sizes = dict(zip(FIELDS, header.tolist()))
    if sizes["kind"] != STEP:
        return sizes, []
    lengths = payload_lengths(sizes)
    payload = torch.empty(sum(lengths), dtype=torch.int64, device=runner.device)
    dist.broadcast(payload, 0, group=tp.device_group)
    return sizes, list(payload.split(lengths))


def step_inputs(sizes: dict[str, int], parts: list[torch.Tensor]) -> StepInputs:
    """A follower's StepInputs over a received payload's parts (no graph key yet)."""
    ids, positions, slots, query_start, seq_lens, table, sample_rows = parts[:7]
    query_start, seq_lens = query_start.to(torch.int32), seq_lens.to(torch.int32)
    attn = AttentionMetadata(
        slot_mapping=slots, query_start_loc=query_start, seq_lens=seq_lens,
        block_tables=table.to(torch.int32).view(sizes["seqs"], sizes["width"]),
        num_actual_tokens=sizes["num_tokens"], max_query_len=sizes["max_query_len"],
        max_seq_len=sizes["max_seq_len"], query_start_loc_cpu=query_start.cpu(),
        seq_lens_cpu=seq_lens.cpu())
    return StepInputs(ids, positions, attn, sizes["num_tokens"], sample_rows, [])


@torch.inference_mode()
def follow(tp: TPGroup, runner: ModelRunner) -> None:
    """A follower's loop: run each step the driver broadcasts until it says stop."""
    while True:
        sizes, parts = _receive(tp, runner)
        if sizes["kind"] == STOP:
            return
        if sizes["kind"] == BLOCKS:
            _follower_blocks(tp, runner)
            continue
        if sizes["kind"] == CAPTURE:
            _follower_capture(tp, runner, sizes)
            continue
        _allocate(runner, sizes["num_blocks"])
        inputs = step_inputs(sizes, parts)
        follow_graph(runner, sizes, inputs)
        if hasattr(runner.forward_fn, "micro_batches"):  # a pipeline stage: the driver's cut
            runner.forward_fn.micro_batches = sizes["micro_batches"]
        # FP8 KV scales the checkpoint lacks: each rank calibrates its own heads on the
        # driver's calibrating step (that step runs without graphs on every rank)
        runner.calibrate_kv = runner.calibrate_kv and not sizes["calibrate_kv"]
        hidden = runner.run_forward(inputs, calibrate=bool(sizes["calibrate_kv"]))
        model = runner.model
        if getattr(model, "lm_head", None) is None:  # an earlier pipeline stage
            continue
        # the driver's LM-head calls, in its order: prompt logprobs, then sampling
        for rows in parts[8].split(parts[7].tolist()):
            model.compute_logits(hidden[rows])
        if sizes["samples"]:
            model.compute_logits(hidden.index_select(0, inputs.sample_rows))
