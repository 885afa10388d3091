"""Pipeline micro-batches: a step is cut at request boundaries into micro-batches of about
equal tokens (the same cut on every rank), each runs as a step of its own metadata (under its
own piecewise graph when the step has one); over gloo in two processes the stages exchange one
transfer per micro-batch and greedy tokens and prompt logprobs equal one rank's, with any
micro-batch count, and no KV block is left held."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compiled_llm import LLM, SamplingParams
from compiled_llm.attention.forward_context import (
    CUDAGraphKey,
    ForwardContext,
    current_forward_context,
    set_forward_context,
)
from compiled_llm.attention.metadata import AttentionMetadata
from compiled_llm.distributed.pipeline_parallel import PipelineStage
from compiled_llm.worker.cudagraph import FULL, PIECEWISE, CUDAGraphDispatcher
from compiled_llm.worker.pipeline_step import (
    ENV_MICRO_BATCHES,
    StageForward,
    micro_batch_count,
    slice_metadata,
    split_requests,
)
from tests.utils import make_checkpoint, random_prompts

BASE = dict(dtype="float32", max_model_len=128, engine_core_process=False, enforce_eager=True,
            kv_cache_memory_bytes=4 << 20)
PARAMS = SamplingParams(temperature=0.0, max_tokens=6, prompt_logprobs=2)


@pytest.mark.parametrize(("starts", "count", "bounds"), [
    ([0, 1, 2, 3, 4], 2, [0, 2, 4]),  # decode: requests split evenly
    ([0, 1, 2, 3], 2, [0, 2, 3]),  # an odd count: a tie goes to the later boundary
    ([0, 30, 31, 32], 2, [0, 1, 3]),  # one long prefill and two decodes
    ([0, 1, 2, 40], 2, [0, 2, 3]),  # the long one last: it stays whole
    ([0, 5], 4, [0, 1]),  # one request: one micro-batch
    ([0, 10, 20, 30], 3, [0, 1, 2, 3]),
    ([0, 100, 101, 102], 3, [0, 1, 2, 3]),  # each micro-batch keeps at least one request
])
def test_split_at_request_boundaries_by_tokens(starts, count, bounds):
    assert split_requests(np.asarray(starts), count) == bounds


def test_sliced_metadata_is_a_step_of_its_own():
    starts = torch.tensor([0, 3, 4, 9], dtype=torch.int32)
    seq_lens = torch.tensor([3, 7, 12], dtype=torch.int32)
    attn = AttentionMetadata(torch.arange(9), starts, seq_lens,
                             torch.arange(12, dtype=torch.int32).view(3, 4), 9, 5, 12,
                             starts, seq_lens)
    sub = slice_metadata(attn, 1, 3)
    assert sub.slot_mapping.tolist() == list(range(3, 9))
    assert sub.query_start_loc.tolist() == sub.query_start_loc_cpu.tolist() == [0, 1, 6]
    assert sub.seq_lens.tolist() == [7, 12] and sub.block_tables.tolist() == [
        [4, 5, 6, 7], [8, 9, 10, 11]]
    assert (sub.num_actual_tokens, sub.max_query_len, sub.max_seq_len, sub.num_seqs) == (
        6, 5, 12, 2)


def test_micro_batch_count_defaults_to_the_stages_and_is_checked(monkeypatch):
    monkeypatch.delenv(ENV_MICRO_BATCHES, raising=False)
    assert micro_batch_count(4) == 4
    monkeypatch.setenv(ENV_MICRO_BATCHES, "3")
    assert micro_batch_count(2) == 3
    for bad in ("0", "-1", "two"):
        monkeypatch.setenv(ENV_MICRO_BATCHES, bad)
        with pytest.raises(ValueError, match=ENV_MICRO_BATCHES):
            micro_batch_count(2)


def _run(llm: LLM, count: int = 5) -> tuple[list, list]:
    prompts = [{"prompt_token_ids": p} for p in random_prompts(count, 300, lo=3, hi=40, seed=7)]
    outs = llm.generate(prompts, PARAMS, use_tqdm=False)
    scores = [[{tok: round(lp.logprob, 4) for tok, lp in row.items()}
               for row in o.prompt_logprobs[1:]] for o in outs]
    return [o.outputs[0].token_ids for o in outs], scores


@pytest.fixture(scope="module")
def reference():
    ckpt = make_checkpoint("llama_3layers")
    llm = LLM(str(ckpt), **BASE)
    try:
        return ckpt, _run(llm)
    finally:
        llm.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("micro_batches", ["1", "2", "3"])
def test_pp2_micro_batches_keep_tokens_and_overlap(reference, micro_batches, monkeypatch):
    ckpt, ref = reference
    monkeypatch.setenv(ENV_MICRO_BATCHES, micro_batches)  # the forked stage inherits it
    llm = LLM(str(ckpt), pipeline_parallel_size=2, **BASE)
    try:
        stage = llm.engine.executor.worker.runner.forward_fn  # rank 0: the last stage
        stage.counts.clear()
        got = _run(llm)
        assert got[0] == ref[0]
        for got_rows, ref_rows in zip(got[1], ref[1], strict=True):
            for got_row, ref_row in zip(got_rows, ref_rows, strict=True):
                assert got_row.keys() == ref_row.keys()
                assert all(abs(got_row[tok] - ref_row[tok]) < 2e-4 for tok in ref_row)
        counts = stage.counts
        # the last stage receives each micro-batch the first stage sends, and sends none
        assert counts["recv"] == counts["micro_batches"] and counts["send"] == 0
        if micro_batches == "1":
            assert counts["micro_batches"] == counts["steps"]
        else:  # five requests: every step of several requests runs in micro-batches
            assert counts["micro_batches"] > counts["steps"]
        assert llm.engine.num_used_blocks == 0
    finally:
        llm.shutdown()


def test_micro_batches_under_piecewise_graphs_run_padded_to_their_own_sizes():
    """A step padded to a piecewise graph (7 tokens in 8 rows): each micro-batch runs under
    the smallest piecewise size holding it, its rows padded, and only its real rows come
    back; a full-graph step runs whole."""
    seen = []

    def inner(ids, positions):
        ctx = current_forward_context()
        seen.append((len(ids), ctx.cudagraph_key, ctx.attn_metadata.num_actual_tokens))
        return (ids * 10 + positions).float().unsqueeze(1)

    dispatcher = CUDAGraphDispatcher()
    dispatcher.piecewise_sizes = [1, 2, 4, 8]
    forward = StageForward(inner, PipelineStage(0, 1, 0, 1), 4, torch.float32,
                           torch.device("cpu"), dispatcher)
    forward.micro_batches = 2
    starts = torch.tensor([0, 3, 4, 7], dtype=torch.int32)
    seq_lens = torch.tensor([3, 5, 9], dtype=torch.int32)
    attn = AttentionMetadata(torch.arange(7), starts, seq_lens,
                             torch.zeros(3, 4, dtype=torch.int32), 7, 3, 9, starts, seq_lens)
    ids, positions = torch.arange(1, 9), torch.arange(8) % 3
    ids[7] = positions[7] = 0  # the padding row
    with set_forward_context(ForwardContext(attn, cudagraph_key=CUDAGraphKey(PIECEWISE, 8))):
        out = forward(ids, positions)
    assert out.squeeze(1).tolist() == (ids * 10 + positions)[:7].float().tolist()
    # [3 + 1 | 3] tokens, each under the graph of 4
    assert seen == [(4, CUDAGraphKey(PIECEWISE, 4), 4), (4, CUDAGraphKey(PIECEWISE, 4), 3)]
    assert forward.counts["micro_batches"] == 2
    seen.clear()
    with set_forward_context(ForwardContext(attn, cudagraph_key=CUDAGraphKey(FULL, 8))):
        forward(ids, positions)
    assert seen == [(8, CUDAGraphKey(FULL, 8), 7)]
