"""Persistent step buffers and the per-request block table: every step's inputs (ids,
positions, slots, query starts, lengths, batch-ordered block table, sample rows) equal the ones
built from scratch, across growth, finishes, preemption with resumption, prefix-cache hits and
row reuse; graph and piecewise padding fill what the graphs read."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from compiled_llm.attention.forward_context import CUDAGraphKey
from compiled_llm.config import SchedulerConfig
from compiled_llm.core.kv_cache_manager import KVCacheManager
from compiled_llm.core.request import Request
from compiled_llm.core.scheduler import Scheduler, SchedulerOutput
from compiled_llm.sampling_params import SamplingParams
from compiled_llm.worker.cudagraph import FULL, PIECEWISE, CUDAGraphDispatcher
from compiled_llm.worker.input_batch import InputBatch
from compiled_llm.worker.step_buffers import BlockTableRows, table_width

BS = 4
CPU = torch.device("cpu")


def reference(sched: SchedulerOutput) -> dict[str, list]:
    """The step's inputs built from scratch, request by request."""
    ref = {k: [] for k in ("ids", "pos", "slots", "qsl", "lens", "sample")}
    ref["qsl"].append(0)
    for req, n in sched.scheduled:
        start = req.num_computed_tokens
        for p in range(start, start + n):
            ref["ids"].append(req.all_token_ids[p])
            ref["pos"].append(p)
            ref["slots"].append(req.block_ids[p // BS] * BS + p % BS)
        ref["qsl"].append(ref["qsl"][-1] + n)
        ref["lens"].append(start + n)
        if start + n == req.num_tokens:
            ref["sample"].append(ref["qsl"][-1] - 1)
    return ref


def check_step(inputs, sched: SchedulerOutput) -> None:
    ref, a, n = reference(sched), inputs.attn, inputs.num_tokens
    assert inputs.input_ids[:n].tolist() == ref["ids"]
    assert inputs.positions[:n].tolist() == ref["pos"]
    assert a.slot_mapping.tolist() == ref["slots"]
    assert a.query_start_loc.tolist() == ref["qsl"] == a.query_start_loc_cpu.tolist()
    assert a.seq_lens.tolist() == ref["lens"] == a.seq_lens_cpu.tolist()
    assert inputs.sample_rows.tolist() == ref["sample"]
    assert [r.request_id for r in inputs.sample_reqs] == [
        sched.scheduled[i][0].request_id for i, (r, c) in enumerate(sched.scheduled)
        if r.num_computed_tokens + c == r.num_tokens]
    for i, (req, _) in enumerate(sched.scheduled):
        assert a.block_tables[i, :len(req.block_ids)].tolist() == req.block_ids
    assert a.decode_order.tolist() == expected_order(ref["lens"], ref["qsl"])


def expected_order(lens: list[int], query_starts: list[int]) -> list[int]:
    """The leading one-token sequences by length, longest first (ties in place), then the
    rest in place."""
    leading = 0
    while leading < len(lens) and query_starts[leading + 1] - query_starts[leading] == 1:
        leading += 1
    head = sorted(range(leading), key=lambda i: (-lens[i], i))
    return head + list(range(leading, len(lens)))


class Driver:
    """Scheduler + KV manager + input batch, stepped the way the runner steps them."""

    def __init__(self, num_blocks: int, max_seqs: int, budget: int, prefix: bool = True):
        self.kv = KVCacheManager(num_blocks, BS, enable_prefix_caching=prefix)
        cfg = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget,
                              max_model_len=48)
        self.sched = Scheduler(cfg, self.kv)
        self.bufs = InputBatch(budget, max_seqs, 48 // BS, BS, CPU)
        self.rng = random.Random(0)
        self.preempted = 0

    def add(self, rid: str, prompt: list[int], max_tokens: int) -> Request:
        req = Request(rid, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        self.sched.add_request(req)
        return req

    def step(self) -> SchedulerOutput:
        out = self.sched.schedule()
        self.bufs.release(out.finished_req_ids, out.preempted_req_ids)
        self.preempted += out.num_preempted
        if out.scheduled:
            check_step(self.bufs.prepare(out), out)
            running = {r.request_id for r in self.sched.running}
            assert set(self.bufs.table._owned) <= running  # no row held by a gone request
        sampled = {r.request_id: self.rng.randrange(3, 50) for r, n in out.scheduled
                   if r.num_computed_tokens + n == r.num_tokens}
        self.sched.advance(out)
        self.sched.resolve(out, sampled)
        return out


def test_rows_grow_over_decode_steps_and_finish_frees_them():
    d = Driver(num_blocks=64, max_seqs=4, budget=64)
    reqs = [d.add(str(i), list(range(5, 5 + 3 + 2 * i)), max_tokens=12) for i in range(4)]
    rows = set()
    while d.sched.has_unfinished():
        d.step()
        rows |= {d.bufs.table.row_of(r.request_id) for r in reqs} - {None}
    assert len(rows) == 4 and 0 not in rows  # one row each; row 0 is the padding row
    d.sched.schedule()  # the next step reports the finishes
    d.bufs.table.release({r.request_id for r in reqs})
    assert d.bufs.table.num_owned == 0


def test_many_requests_reuse_rows_with_prefix_hits_and_preemption():
    d = Driver(num_blocks=14, max_seqs=4, budget=16)
    shared = [7, 8, 9, 10, 11, 12, 13, 14, 15]
    rng = random.Random(1)
    for i in range(40):
        prompt = shared[: rng.randrange(0, 9)] + [rng.randrange(3, 50) for _ in range(3)]
        d.add(f"r{i}", prompt, max_tokens=rng.randrange(1, 16))
        if i % 3 == 2:
            d.step()
    while d.sched.has_unfinished():
        d.step()
    assert d.preempted > 0  # the pool is small: requests were preempted and resumed
    assert d.kv.stats.hit_blocks > 0  # and new requests started from cached blocks
    assert d.kv.num_used_blocks == 0


def test_preempted_request_resumes_with_a_correct_table():
    d = Driver(num_blocks=7, max_seqs=2, budget=32, prefix=False)  # 6 usable blocks
    a = d.add("a", list(range(3, 11)), max_tokens=12)
    b = d.add("b", list(range(20, 28)), max_tokens=12)
    preempted: set[str] = set()
    while d.sched.has_unfinished():
        out = d.step()  # checks every step's table against the block lists
        preempted |= out.preempted_req_ids
        assert not out.preempted_req_ids & set(d.bufs.table._owned)  # rows given back
    assert preempted and a.is_finished and b.is_finished
    assert a.num_preemptions + b.num_preemptions == d.preempted


def test_a_replaced_block_list_rewrites_the_row_without_release():
    table = BlockTableRows(2, 6, CPU)
    req = Request("x", [1, 2, 3], SamplingParams())
    req.block_ids = [5, 6, 7]
    rows = np.empty(1, dtype=np.int64)
    table.update([req], rows)
    req.block_ids = [9]  # freed and re-allocated (preemption) under the same id
    entries = table.update([req], rows)
    assert entries.tolist() == [rows[0] * 6]  # only column 0 rewritten
    assert table.host[rows[0], :1].tolist() == [9]
    req.block_ids.extend([4, 3])
    assert len(table.update([req], rows)) == 2  # appended entries only
    assert table.update([req], rows).size == 0  # nothing new: nothing written


def test_the_table_grows_past_its_rows():
    table = BlockTableRows(1, 2, CPU)
    reqs = [Request(str(i), [1], SamplingParams()) for i in range(3)]
    for i, r in enumerate(reqs):
        r.block_ids = [i + 1]
    rows = np.empty(3, dtype=np.int64)
    entries = table.update(reqs, rows)
    table.device.view(-1)[torch.from_numpy(entries)] = torch.from_numpy(
        table.host.reshape(-1)[entries])
    assert sorted(rows.tolist()) == [1, 2, 3]
    assert table.device[torch.from_numpy(rows), 0].tolist() == [1, 2, 3]


def decode_batch(b: int) -> SchedulerOutput:
    out = SchedulerOutput()
    for i in range(b):
        req = Request(str(i), list(range(3, 9 + i)), SamplingParams())
        req.num_computed_tokens = req.num_tokens - 1
        req.block_ids = list(range(10 + 4 * i, 14 + 4 * i))[: -(-req.num_tokens // BS)]
        out.scheduled.append((req, 1))
    return out


@pytest.mark.parametrize("b,size", [(3, 8), (8, 8)])
def test_graph_padding_fills_what_the_graph_reads(b, size):
    dispatcher = CUDAGraphDispatcher()
    bufs = InputBatch(32, 16, 4, BS, CPU, dispatcher)
    bufs.prepare(decode_batch(8))  # leave stale rows behind
    sched = decode_batch(b)
    dispatcher.full_sizes = [size]
    inputs = bufs.prepare(sched)
    check_step(inputs, sched)
    assert inputs.cudagraph_key == CUDAGraphKey(FULL, size) and inputs.all_rows_sample
    views = bufs.views(size, size).dev  # exactly the views a graph of this size captured
    assert views["ids"][b:].tolist() == [0] * (size - b) == views["slots"][b:].tolist()
    assert views["seq_lens"][b:].tolist() == [1] * (size - b)
    assert views["query_start_loc"].tolist() == list(range(size + 1))
    # the graph's decode launches the real sequences longest first, the padding last
    assert views["order"].tolist() == list(range(b - 1, -1, -1)) + list(range(b, size))
    # padding rows hold one token (block column 0); the columns gathered are the null row's,
    # the ones past them keep stale ids that no sequence of the step reaches
    width = table_width(-(-max(req.num_tokens for req, _ in sched.scheduled) // BS), 4)
    assert bufs.table_width == width and not views["block_tables"][b:, :width].any()


def test_piecewise_padding_pads_tokens_not_sequences():
    dispatcher = CUDAGraphDispatcher()
    dispatcher.full_sizes, dispatcher.piecewise_sizes = [4], [2, 8]
    bufs = InputBatch(32, 16, 4, BS, CPU, dispatcher)
    sched = decode_batch(2)
    sched.scheduled[1][0].num_computed_tokens -= 2  # a 3-token chunk: not pure decode
    sched.scheduled[1] = (sched.scheduled[1][0], 3)
    inputs = bufs.prepare(sched)
    check_step(inputs, sched)
    assert inputs.cudagraph_key == CUDAGraphKey(PIECEWISE, 8) and inputs.input_ids.shape[0] == 8
    assert inputs.input_ids[4:].tolist() == [0] * 4 and inputs.attn.num_actual_tokens == 4
    assert inputs.sample_rows.tolist() == [0, 3] and not inputs.all_rows_sample


def verify_batch(b: int, query_len: int) -> SchedulerOutput:
    """b requests each verifying query_len - 1 drafts (query_len new tokens)."""
    out = decode_batch(b)
    for i, (req, _) in enumerate(out.scheduled):
        req.spec_token_ids = [5] * (query_len - 1)
        blocks = -(-(req.num_computed_tokens + query_len) // BS)
        req.block_ids = list(range(10 + 4 * i, 10 + 4 * i + blocks))
    out.scheduled = [(req, query_len) for req, _ in out.scheduled]
    return out


def test_uniform_verify_batches_get_a_full_graph_of_padded_sequences():
    dispatcher = CUDAGraphDispatcher()
    dispatcher.full_sizes, dispatcher.piecewise_sizes = [1, 2, 4], [4, 8, 16]
    dispatcher.uniform_sizes, dispatcher.uniform_query_len = [1, 2, 4], 3
    bufs = InputBatch(32, 16, 8, BS, CPU, dispatcher)
    inputs = bufs.prepare(verify_batch(3, 3))
    assert inputs.cudagraph_key == CUDAGraphKey(FULL, 12, 3) and inputs.num_tokens == 9
    views = bufs.views(12, 4)  # what the graph of 4 sequences x 3 tokens captured
    assert views.dev["query_start_loc"].tolist() == [0, 3, 6, 9, 12]
    assert views.dev["seq_lens"][3:].tolist() == [3] and not views.dev["slots"][9:].any()
    assert inputs.input_ids.data_ptr() == views.dev["ids"].data_ptr()
    # a batch whose queries differ in length, or longer than the graphs, runs piecewise
    mixed = verify_batch(2, 3)
    mixed.scheduled[1] = (mixed.scheduled[1][0], 2)
    assert bufs.prepare(mixed).cudagraph_key == CUDAGraphKey(PIECEWISE, 8)
    assert bufs.prepare(verify_batch(5, 3)).cudagraph_key == CUDAGraphKey(PIECEWISE, 16)
    assert dispatcher.dispatch(2, 8, 4) == CUDAGraphKey(PIECEWISE, 8)  # another query length


def test_padded_verify_sequences_leave_the_real_rows_attention_unchanged():
    from compiled_llm.attention.reference import attention_forward
    from compiled_llm.worker.input_batch import attention_metadata

    dispatcher = CUDAGraphDispatcher()
    dispatcher.full_sizes, dispatcher.uniform_sizes, dispatcher.uniform_query_len = [4], [4], 3
    bufs = InputBatch(32, 16, 8, BS, CPU, dispatcher)
    inputs = bufs.prepare(verify_batch(2, 3))
    torch.manual_seed(0)
    heads, dim, padded = 2, 8, 12
    cache = torch.randn(2, 40, BS, heads, dim)
    q, k, v = (torch.randn(padded, heads, dim) for _ in range(3))
    cut = attention_forward(q, k, v, cache.clone(), inputs.attn, 0.3, 0)[:6]
    # the whole padded batch, as the captured graph sees it
    whole = attention_metadata(bufs.views(padded, 4), padded, 4, 3, 48, BS)
    out = attention_forward(q, k, v, cache.clone(), whole, 0.3, 0)
    torch.testing.assert_close(out[:6], cut)
    assert torch.isfinite(out).all()
