"""CUDA graphs across ranks, on CPU (no graphs here; the protocol and the follower's buffers):
the driver's capture message reaches the follower, which captures the same sizes in the same
order after settling the driver's max_model_len and KV pool; ranks that captured different
sizes are caught; a follower's full-graph step lands in the persistent views its graph reads
exactly as the driver's input batch filled its own."""

from __future__ import annotations

import multiprocessing
import socket
from types import SimpleNamespace

import pytest
import torch

from compiled_llm.core.request import Request
from compiled_llm.core.scheduler import SchedulerOutput
from compiled_llm.distributed.parallel_state import destroy_tp_group, init_tp_group
from compiled_llm.sampling_params import SamplingParams
from compiled_llm.worker.cudagraph import FULL, CUDAGraphDispatcher
from compiled_llm.worker.input_batch import InputBatch
from compiled_llm.worker.tp_follower import (
    FIELDS,
    StepBroadcaster,
    follow,
    payload_lengths,
    step_inputs,
    step_message,
)
from compiled_llm.worker.tp_graphs import GRAPH_MODES, follow_graph

CPU = torch.device("cpu")
PLAN = ([1, 2, 4, 8], [1, 2, 4])


class _Runner:
    """What the capture protocol touches of a ModelRunner; capture_cudagraphs records the
    plan (a follower told to `drop` one size captures the others only)."""

    def __init__(self, drop: int | None = None) -> None:
        self.dispatcher, self.drop = CUDAGraphDispatcher(), drop
        self.max_model_len, self.kv_caches, self.forward_fn = 512, [], None
        self.calls: list = []

    def set_max_model_len(self, max_model_len: int) -> None:
        self.calls.append(("max_model_len", max_model_len))
        self.max_model_len = max_model_len

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.calls.append(("blocks", num_blocks))
        self.kv_caches = [torch.zeros(2, num_blocks)]

    def capture_cudagraphs(self, plan) -> None:
        self.calls.append(("capture", plan))
        piecewise, full = plan
        self.dispatcher.piecewise_sizes = [s for s in piecewise if s != self.drop]
        self.dispatcher.full_sizes = list(full)


def _follower(init_method: str, drop: int | None, conn) -> None:
    tp = init_tp_group(1, 2, init_method, CPU)
    runner = _Runner(drop)
    follow(tp, runner)
    conn.send(runner.calls)
    destroy_tp_group()


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _capture(drop: int | None):
    init_method = f"tcp://127.0.0.1:{_port()}"
    ctx = multiprocessing.get_context("fork")
    recv_end, send_end = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_follower, args=(init_method, drop, send_end), daemon=True)
    proc.start()
    tp = init_tp_group(0, 2, init_method, CPU)
    runner = _Runner()
    runner.max_model_len = 96  # settled from the KV pool: the follower's is the upper bound
    runner.allocate_kv_cache(40)
    hook = StepBroadcaster(tp, runner)
    try:
        hook.capture(PLAN)
    finally:
        hook.stop()
        calls = recv_end.recv()
        proc.join(30)
        destroy_tp_group()
    return runner, calls


@pytest.mark.slow
def test_followers_capture_the_drivers_plan_in_lockstep():
    driver, calls = _capture(drop=None)
    assert driver.calls[-1] == ("capture", PLAN)
    # the driver's length and pool first (graphs read the buffers and the cache), then its plan
    assert calls == [("max_model_len", 96), ("blocks", 40), ("capture", PLAN)]


@pytest.mark.slow
def test_ranks_that_captured_different_sizes_are_caught():
    with pytest.raises(RuntimeError, match="captured different sizes"):
        _capture(drop=4)


def _decode_step(batch: InputBatch):
    reqs = []
    for i in range(3):
        req = Request(f"r{i}", list(range(1, 7 + 3 * i)), SamplingParams(max_tokens=4))
        req.num_computed_tokens = req.num_tokens - 1
        req.block_ids = [10 + 4 * i + b for b in range(-(-req.num_tokens // 4))]
        reqs.append(req)
    return batch.prepare(SchedulerOutput([(req, 1) for req in reqs]))


def test_a_followers_full_graph_step_fills_the_views_its_graph_reads():
    dispatcher = CUDAGraphDispatcher()
    dispatcher.full_sizes = [4]  # three decode requests run padded to the graph of 4
    driver = InputBatch(64, 8, 8, 4, CPU, dispatcher, vocab_size=100)
    inputs = _decode_step(driver)
    assert inputs.cudagraph_key.mode == FULL and inputs.cudagraph_key.num_tokens == 4
    header, payload = step_message(SimpleNamespace(kv_caches=[], forward_fn=None,
                                                   device=CPU), inputs)
    sizes = dict(zip(FIELDS, header.tolist()))
    assert GRAPH_MODES[sizes["graph_mode"]] == FULL and sizes["graph_size"] == 4
    follower = SimpleNamespace(input_batch=InputBatch(64, 8, 8, 4, CPU), device=CPU)
    follower.input_batch.views(4, 4).dev["slots"].fill_(7)  # stale rows of an earlier step
    got = step_inputs(sizes, list(payload.split(payload_lengths(sizes))))
    follow_graph(follower, sizes, got)
    assert got.cudagraph_key == inputs.cudagraph_key
    ours, theirs = follower.input_batch.views(4, 4).dev, driver.views(4, 4).dev
    assert got.input_ids.data_ptr() == ours["ids"].data_ptr()  # the graph's own inputs
    for name in ("ids", "pos", "slots", "query_start_loc", "seq_lens", "order"):
        assert ours[name].tolist() == theirs[name].tolist(), name
    assert theirs["order"].tolist() == [2, 1, 0, 3]  # longest first, the padding last
    width = sizes["width"]
    assert ours["block_tables"][:, :width].tolist() == theirs["block_tables"][:, :width].tolist()
