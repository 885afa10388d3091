"""Scheduler + KVCacheManager driven by fake model steps: budgets, chunked prefill, stop rules,
abort, preemption by recompute and max_model_len."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest

from compiled_llm.config import SchedulerConfig
from compiled_llm.core.kv_cache_manager import NULL_BLOCK, KVCacheManager
from compiled_llm.core.request import Request, RequestStatus
from compiled_llm.core.scheduler import Scheduler, SchedulerOutput
from compiled_llm.sampling_params import SamplingParams

EOS = 2
FILLER = 1000  # default sampled tokens: 1000, 1001, ... never EOS or a stop id


def make_req(
    rid: str,
    num_prompt: int,
    arrival: float,
    eos: tuple[int, ...] = (EOS,),
    **params,
) -> Request:
    params.setdefault("max_tokens", 4)
    prompt = [10 + (i % 50) for i in range(num_prompt)]
    return Request(rid, prompt, SamplingParams(**params), eos_token_ids=eos, arrival_time=arrival)


def make_sched(
    num_blocks: int = 64,
    block_size: int = 4,
    prefix_caching: bool = False,  # these tests pin exact block counts; caching has its own
    **cfg,
) -> tuple[Scheduler, KVCacheManager]:
    kv = KVCacheManager(num_blocks, block_size, enable_prefix_caching=prefix_caching)
    return Scheduler(SchedulerConfig(**cfg), kv), kv


def filler(req: Request) -> int:
    return FILLER + req.num_output_tokens


def check_invariants(sched: Scheduler, out: SchedulerOutput) -> None:
    """What must hold right after schedule(), before the step's update()."""
    cfg, kv = sched.cfg, sched.kv
    assert out.total_tokens <= cfg.max_num_batched_tokens
    assert len(out.scheduled) <= cfg.max_num_seqs
    assert len(sched.running) <= cfg.max_num_seqs
    ids = [r.request_id for r, _ in out.scheduled]
    assert len(ids) == len(set(ids)), "a request scheduled twice in one step"
    for req, n in out.scheduled:
        assert n >= 1
        assert req in sched.running
        assert req.num_computed_tokens + n <= req.num_tokens
        assert len(req.block_ids) * kv.block_size >= req.num_computed_tokens + n
    held = Counter(b for r in sched.running for b in r.block_ids)
    assert NULL_BLOCK not in held
    for b, refs in held.items():  # shared (prefix-cached) blocks carry one ref per holder
        assert kv.pool.blocks[b].ref_cnt == refs
    assert kv.num_used_blocks == len(held)
    for req in sched.waiting:
        assert req.block_ids == []
        assert req.num_computed_tokens == 0


def complete_step(sched: Scheduler, out, sampled: dict[str, int]) -> list:
    """What the engine does once a step ran: progress first, then the sampled tokens."""
    sched.advance(out)
    return sched.resolve(out, sampled)


def fake_step(
    sched: Scheduler, token_fn: Callable[[Request], int] = filler
) -> tuple[SchedulerOutput, list[Request]]:
    """Schedule, 'run the model', sample a token for each request whose chunk reaches its end."""
    out = sched.schedule()
    check_invariants(sched, out)
    sampled = {
        req.request_id: token_fn(req)
        for req, n in out.scheduled
        if req.num_computed_tokens + n == req.num_tokens
    }
    return out, complete_step(sched, out, sampled)


def run_to_completion(
    sched: Scheduler,
    token_fn: Callable[[Request], int] = filler,
    max_steps: int = 1000,
) -> list[SchedulerOutput]:
    outs = []
    while sched.has_unfinished():
        assert len(outs) < max_steps, "scheduler made no progress"
        outs.append(fake_step(sched, token_fn)[0])
    return outs


def layout(out: SchedulerOutput) -> list[tuple[str, int]]:
    return [(r.request_id, n) for r, n in out.scheduled]


# ----------------------------------------------------------------------------- budgets
def test_token_budget_and_max_num_seqs_are_never_exceeded():
    sched, kv = make_sched(num_blocks=128, max_num_seqs=3, max_num_batched_tokens=10)
    reqs = [make_req(f"r{i}", 1 + (7 * i) % 23, arrival=i, max_tokens=5) for i in range(9)]
    for r in reqs:
        sched.add_request(r)

    outs = run_to_completion(sched)

    assert max(len(o.scheduled) for o in outs) == 3  # the cap was actually reached
    assert max(o.total_tokens for o in outs) == 10  # and the budget filled
    for r in reqs:
        assert r.num_output_tokens == 5
        assert r.finish_reason == "length"
    assert kv.num_used_blocks == 0


def test_empty_scheduler_schedules_nothing():
    sched, kv = make_sched()
    out = sched.schedule()
    assert out.is_empty
    assert out.total_tokens == 0
    assert not sched.has_unfinished()
    assert kv.num_used_blocks == 0


# ----------------------------------------------------------------------------- chunked prefill
def test_chunked_prefill_splits_a_long_prompt_and_finishes_it():
    sched, kv = make_sched(max_num_batched_tokens=8)
    req = make_req("long", 20, arrival=0, max_tokens=3)
    sched.add_request(req)

    seen = []
    for _ in range(3):
        out, progressed = fake_step(sched)
        seen.append((layout(out), req.num_computed_tokens, req.num_output_tokens))
    assert seen == [
        ([("long", 8)], 8, 0),  # no token for a partial chunk
        ([("long", 8)], 16, 0),
        ([("long", 4)], 20, 1),  # last chunk samples the first token
    ]
    outs = run_to_completion(sched)
    assert [layout(o) for o in outs] == [[("long", 1)], [("long", 1)]]
    assert req.num_output_tokens == 3
    assert req.finish_reason == "length"
    assert kv.num_used_blocks == 0


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_budget():
    sched, kv = make_sched(
        max_num_batched_tokens=16, max_model_len=16, enable_chunked_prefill=False
    )
    a = make_req("a", 10, arrival=0, max_tokens=2)
    b = make_req("b", 10, arrival=1, max_tokens=2)
    sched.add_request(a)
    sched.add_request(b)

    out, _ = fake_step(sched)
    assert layout(out) == [("a", 10)]  # b would only get 6 of 10: not split
    out, _ = fake_step(sched)
    assert layout(out) == [("a", 1), ("b", 10)]
    run_to_completion(sched)
    assert a.num_output_tokens == b.num_output_tokens == 2
    assert kv.num_used_blocks == 0


def _prefill_ahead_of_decode(sched, kv, prompt_len: int, computed: int):
    """White-box setup: b is mid-prefill (`computed` of `prompt_len` tokens) and sits ahead of
    a, which is decoding its 3-token prompt. Returns (b, a)."""
    b = make_req("b_prefill", prompt_len, arrival=0, max_tokens=2)
    a = make_req("a_decode", 3, arrival=1, max_tokens=2)
    sched.add_request(b)
    sched.add_request(a)
    sched.waiting.clear()
    assert kv.allocate_slots(b, computed)
    b.num_computed_tokens = computed
    assert kv.allocate_slots(a, 3)
    a.num_computed_tokens = 3
    a.append_token(filler(a))
    a.status = b.status = RequestStatus.RUNNING
    sched.running = [b, a]
    return b, a


def test_running_decodes_are_scheduled_before_prefill_chunks():
    sched, kv = make_sched(max_num_batched_tokens=10)
    b, a = _prefill_ahead_of_decode(sched, kv, prompt_len=30, computed=10)

    out, _ = fake_step(sched)
    assert layout(out) == [("a_decode", 1), ("b_prefill", 9)]
    run_to_completion(sched)
    assert a.finish_reason == b.finish_reason == "length"
    assert kv.num_used_blocks == 0


def test_decodes_keep_streaming_while_a_long_prompt_prefills():
    sched, kv = make_sched(max_num_batched_tokens=6)
    a = make_req("a", 2, arrival=0, max_tokens=8)
    b = make_req("b", 30, arrival=1, max_tokens=1)
    sched.add_request(a)
    sched.add_request(b)
    outs = run_to_completion(sched)
    a_chunks = [n for o in outs for r, n in o.scheduled if r is a]
    b_chunks = [n for o in outs for r, n in o.scheduled if r is b]
    assert a_chunks == [2] + [1] * 7  # a decode token every step, never starved
    assert b_chunks == [4, 5, 5, 5, 5, 5, 1]  # b prefills with what is left
    for out in outs[1:7]:
        assert out.scheduled[0][0] is a
    assert a.num_output_tokens == 8
    assert b.num_output_tokens == 1
    assert kv.num_used_blocks == 0


# ----------------------------------------------------------------------------- stop rules
def test_finishes_on_max_tokens():
    sched, kv = make_sched()
    req = make_req("r", 5, arrival=0, max_tokens=4)
    sched.add_request(req)
    run_to_completion(sched)
    assert req.output_token_ids == [FILLER, FILLER + 1, FILLER + 2, FILLER + 3]
    assert req.status is RequestStatus.FINISHED_LENGTH
    assert req.finish_reason == "length"
    assert req.stop_reason is None
    assert kv.num_used_blocks == 0


def eos_at(k: int, token: int = EOS) -> Callable[[Request], int]:
    """Emit `token` as output number k (1-based) and every one after it."""
    return lambda req: token if req.num_output_tokens + 1 >= k else filler(req)


def test_finishes_on_eos():
    sched, kv = make_sched()
    req = make_req("r", 5, arrival=0, max_tokens=10)
    sched.add_request(req)
    run_to_completion(sched, eos_at(3))
    assert req.output_token_ids == [FILLER, FILLER + 1, EOS]
    assert req.status is RequestStatus.FINISHED_STOPPED
    assert req.finish_reason == "stop"
    assert req.stop_reason is None
    assert kv.num_used_blocks == 0


def test_any_of_several_eos_ids_stops():
    sched, kv = make_sched()
    req = make_req("r", 5, arrival=0, eos=(7, 8), max_tokens=10)
    sched.add_request(req)
    run_to_completion(sched, eos_at(2, token=8))
    assert req.output_token_ids == [FILLER, 8]
    assert req.finish_reason == "stop"
    assert kv.num_used_blocks == 0


def test_ignore_eos_runs_to_max_tokens():
    sched, kv = make_sched()
    req = make_req("r", 5, arrival=0, max_tokens=6, ignore_eos=True)
    sched.add_request(req)
    run_to_completion(sched, eos_at(2))
    assert req.output_token_ids == [FILLER] + [EOS] * 5
    assert req.finish_reason == "length"
    assert kv.num_used_blocks == 0


def test_finishes_on_stop_token_ids_with_the_token_as_reason():
    sched, kv = make_sched()
    req = make_req("r", 5, arrival=0, max_tokens=10, stop_token_ids=[55, 77])
    sched.add_request(req)
    run_to_completion(sched, eos_at(4, token=77))
    assert req.output_token_ids[-1] == 77
    assert req.num_output_tokens == 4
    assert req.status is RequestStatus.FINISHED_STOPPED
    assert req.stop_reason == 77
    assert kv.num_used_blocks == 0


def test_stop_token_ids_apply_even_with_ignore_eos():
    sched, kv = make_sched()
    req = make_req("r", 5, arrival=0, max_tokens=10, ignore_eos=True, stop_token_ids=[EOS])
    sched.add_request(req)
    run_to_completion(sched, eos_at(2))
    assert req.output_token_ids == [FILLER, EOS]
    assert req.stop_reason == EOS
    assert kv.num_used_blocks == 0


@pytest.mark.parametrize("min_tokens", [1, 3, 5])
def test_min_tokens_suppresses_eos_and_stop_ids_until_reached(min_tokens):
    sched, kv = make_sched()
    eos_req = make_req("eos", 5, arrival=0, max_tokens=10, min_tokens=min_tokens)
    stop_req = make_req(
        "stop", 5, arrival=1, max_tokens=10, min_tokens=min_tokens, stop_token_ids=[66]
    )
    sched.add_request(eos_req)
    sched.add_request(stop_req)
    run_to_completion(sched, lambda r: EOS if r is eos_req else 66)  # stop token every step
    assert eos_req.output_token_ids == [EOS] * min_tokens
    assert eos_req.finish_reason == "stop"
    assert stop_req.output_token_ids == [66] * min_tokens
    assert stop_req.stop_reason == 66
    assert kv.num_used_blocks == 0


def test_max_tokens_wins_when_equal_to_min_tokens():
    sched, kv = make_sched()
    req = make_req("r", 5, arrival=0, max_tokens=3, min_tokens=3)
    sched.add_request(req)
    run_to_completion(sched)
    assert req.num_output_tokens == 3
    assert req.finish_reason == "length"
    assert kv.num_used_blocks == 0


# ----------------------------------------------------------------------------- max_model_len
@pytest.mark.parametrize("num_prompt", [16, 17, 40])
def test_prompt_not_below_max_model_len_is_rejected(num_prompt):
    sched, kv = make_sched(max_model_len=16)
    with pytest.raises(ValueError, match="max_model_len"):
        sched.add_request(make_req("r", num_prompt, arrival=0))
    assert not sched.has_unfinished()
    assert kv.num_used_blocks == 0


def test_prompt_that_can_never_fit_the_pool_is_rejected():
    sched, kv = make_sched(num_blocks=3, block_size=4, max_model_len=64)  # 8 slots
    sched.add_request(make_req("ok", 7, arrival=0, max_tokens=1))  # 7 + 1 fits exactly
    with pytest.raises(ValueError, match="KV cache"):
        sched.add_request(make_req("big", 8, arrival=1))
    run_to_completion(sched)
    assert kv.num_used_blocks == 0


@pytest.mark.parametrize(("num_prompt", "expected_outputs"), [(15, 1), (12, 4), (5, 11)])
def test_reaching_max_model_len_finishes_with_length(num_prompt, expected_outputs):
    sched, kv = make_sched(max_model_len=16)
    req = make_req("r", num_prompt, arrival=0, max_tokens=None)
    sched.add_request(req)
    run_to_completion(sched)
    assert req.num_tokens == 16
    assert req.num_output_tokens == expected_outputs
    assert req.finish_reason == "length"
    assert kv.num_used_blocks == 0


# ----------------------------------------------------------------------------- finish / abort
def test_abort_running_request_returns_blocks_at_once():
    sched, kv = make_sched()
    a = make_req("a", 9, arrival=0, max_tokens=10)
    b = make_req("b", 5, arrival=1, max_tokens=10)
    sched.add_request(a)
    sched.add_request(b)
    fake_step(sched)
    b_blocks = len(b.block_ids)
    assert kv.num_used_blocks == len(a.block_ids) + b_blocks

    assert sched.abort("a") is a
    assert a.block_ids == []
    assert kv.num_used_blocks == b_blocks
    assert a.status is RequestStatus.FINISHED_ABORTED
    assert a.finish_reason == "abort"
    assert a not in sched.running
    assert "a" not in sched.requests

    assert sched.abort("a") is None  # already gone
    assert sched.abort("nope") is None
    out = sched.schedule()
    assert "a" in out.finished_req_ids
    assert all(r is not a for r, _ in out.scheduled)
    complete_step(sched, out, {r.request_id: filler(r) for r, _ in out.scheduled})
    run_to_completion(sched)
    assert b.finish_reason == "length"
    assert kv.num_used_blocks == 0


def test_abort_waiting_request_removes_it_from_the_queue():
    sched, kv = make_sched(max_num_seqs=1)
    a = make_req("a", 5, arrival=0)
    b = make_req("b", 5, arrival=1)
    sched.add_request(a)
    sched.add_request(b)
    fake_step(sched)
    assert list(sched.waiting) == [b]
    assert sched.abort("b") is b
    assert not sched.waiting
    assert b.finish_reason == "abort"
    run_to_completion(sched)
    assert a.finish_reason == "length"
    assert kv.num_used_blocks == 0


def test_abort_during_a_step_is_skipped_by_update():
    sched, kv = make_sched()
    req = make_req("r", 6, arrival=0)
    sched.add_request(req)
    out = sched.schedule()
    sched.abort("r")  # e.g. the client went away while the model ran
    assert kv.num_used_blocks == 0
    progressed = complete_step(sched, out, {"r": 123})
    assert progressed == []
    assert req.output_token_ids == []
    assert req.status is RequestStatus.FINISHED_ABORTED
    assert not sched.has_unfinished()
    assert kv.num_used_blocks == 0


def test_finish_is_idempotent_and_keeps_the_first_status():
    sched, kv = make_sched()
    req = make_req("r", 6, arrival=0)
    sched.add_request(req)
    fake_step(sched)
    sched.finish(req, RequestStatus.FINISHED_STOPPED, "stop-string")
    assert kv.num_used_blocks == 0
    sched.finish(req, RequestStatus.FINISHED_ABORTED)
    assert req.status is RequestStatus.FINISHED_STOPPED
    assert req.stop_reason == "stop-string"
    assert kv.num_used_blocks == 0


def test_finished_ids_are_reported_in_the_next_output_only():
    sched, kv = make_sched()
    a = make_req("a", 4, arrival=0, max_tokens=1)
    b = make_req("b", 4, arrival=1, max_tokens=3)
    sched.add_request(a)
    sched.add_request(b)

    out1, _ = fake_step(sched)
    assert out1.finished_req_ids == set()
    assert a.finish_reason == "length"  # finished during update of step 1
    out2, _ = fake_step(sched)
    assert out2.finished_req_ids == {"a"}
    out3, _ = fake_step(sched)
    assert out3.finished_req_ids == set()
    assert b.finish_reason == "length"  # finished during update of step 3
    out4 = sched.schedule()
    assert out4.is_empty
    assert out4.finished_req_ids == {"b"}
    assert sched.schedule().finished_req_ids == set()
    assert kv.num_used_blocks == 0


# ----------------------------------------------------------------------------- preemption
def test_pool_exhaustion_preempts_the_newest_running_request():
    # 4 usable blocks of 4 slots; two 6-token prompts hold 2 blocks each
    sched, kv = make_sched(num_blocks=5, block_size=4, max_num_seqs=2)
    a = make_req("a", 6, arrival=0, max_tokens=6)
    b = make_req("b", 6, arrival=1, max_tokens=6)
    c = make_req("c", 3, arrival=2, max_tokens=2)
    for r in (a, b, c):
        sched.add_request(r)

    for _ in range(3):  # prefill, then decodes filling slots 7 and 8
        out, _ = fake_step(sched)
        assert out.num_preempted == 0
    assert kv.pool.num_free == 0
    assert a.num_computed_tokens == b.num_computed_tokens == 8
    b_outputs = list(b.output_token_ids)

    out, _ = fake_step(sched)  # both need a 3rd block; b (newest) makes room for a
    assert out.num_preempted == 1
    assert layout(out) == [("a", 1)]
    assert b.status is RequestStatus.PREEMPTED
    assert b.block_ids == []
    assert b.num_computed_tokens == 0
    assert b.num_preemptions == 1
    assert b.output_token_ids == b_outputs  # recompute keeps what was generated
    assert list(sched.waiting) == [b, c]  # front of the queue, ahead of c
    assert sched.running == [a]
    assert sched.num_preemptions == 1
    assert len(a.block_ids) == 3

    outs = run_to_completion(sched)
    for r in (a, b, c):
        assert r.finish_reason == "length"
    assert a.num_output_tokens == b.num_output_tokens == 6
    assert b.num_tokens == 12
    # b was recomputed from scratch: prompt plus its earlier outputs in one go
    b_chunks = [n for o in outs for r, n in o.scheduled if r is b]
    assert b_chunks[0] == 9
    assert kv.num_used_blocks == 0


def test_newest_request_preempts_itself_rather_than_an_older_scheduled_one():
    # 5 usable blocks: after both prefills one is left for the first to need it
    sched, kv = make_sched(num_blocks=6, block_size=4)
    a = make_req("a", 6, arrival=0, max_tokens=6)
    b = make_req("b", 6, arrival=1, max_tokens=6)
    sched.add_request(a)
    sched.add_request(b)
    for _ in range(3):
        fake_step(sched)
    assert kv.pool.num_free == 1
    a_blocks = list(a.block_ids)

    out, _ = fake_step(sched)
    assert layout(out) == [("a", 1)]
    assert out.num_preempted == 1
    assert a.block_ids[:2] == a_blocks  # a kept its blocks and took the free one
    assert b.status is RequestStatus.PREEMPTED
    assert list(sched.waiting) == [b]

    run_to_completion(sched)
    assert a.num_output_tokens == b.num_output_tokens == 6
    assert kv.num_used_blocks == 0


def test_an_already_scheduled_request_is_never_the_preemption_victim():
    # 3 usable blocks of 8 slots; the newer request decodes first (scheduled), then the older
    # one's prefill chunk runs out of blocks: it must preempt itself, not the scheduled decode
    sched, kv = make_sched(num_blocks=4, block_size=8, max_num_batched_tokens=13)
    b, a = _prefill_ahead_of_decode(sched, kv, prompt_len=20, computed=8)
    assert kv.pool.num_free == 1

    out, _ = fake_step(sched)
    assert layout(out) == [("a_decode", 1)]
    assert out.num_preempted == 1
    assert b.status is RequestStatus.PREEMPTED
    assert list(sched.waiting) == [b]
    run_to_completion(sched)
    assert a.num_output_tokens == b.num_output_tokens == 2
    assert kv.num_used_blocks == 0


def test_no_admissions_in_a_step_that_preempted():
    # a small budget leaves room for a chunk of the preempted request in the same step;
    # it must still wait for the next one
    sched, kv = make_sched(num_blocks=5, block_size=4, max_num_batched_tokens=4)
    a = make_req("a", 6, arrival=0, max_tokens=6)
    b = make_req("b", 3, arrival=1, max_tokens=6)
    sched.add_request(a)
    sched.add_request(b)
    for _ in range(20):
        out, _ = fake_step(sched)
        if out.num_preempted:
            break
    assert out.num_preempted == 1
    assert layout(out) == [("a", 1)]
    assert kv.pool.num_free >= 1  # b's first chunk would have fit
    assert list(sched.waiting) == [b]
    out, _ = fake_step(sched)
    assert ("b", 3) in layout(out)  # readmitted next step, chunked to the budget left
    run_to_completion(sched)
    assert a.num_output_tokens == b.num_output_tokens == 6
    assert kv.num_used_blocks == 0


def test_heavy_pressure_everything_finishes_and_the_pool_drains():
    # 12 usable blocks x 4 slots = 48 >= max_model_len, so any single request always fits
    sched, kv = make_sched(
        num_blocks=13, block_size=4, max_num_seqs=6, max_num_batched_tokens=16, max_model_len=40
    )
    reqs = [
        make_req(f"r{i}", 3 + (5 * i) % 17, arrival=i, max_tokens=4 + (3 * i) % 13)
        for i in range(12)
    ]
    for r in reqs:
        sched.add_request(r)

    run_to_completion(sched, max_steps=2000)

    assert sched.num_preemptions > 0  # the test really exercised preemption
    for r in reqs:
        assert r.is_finished
        assert r.finish_reason == "length"
        expected = min(r.sampling_params.max_tokens, 40 - r.num_prompt_tokens)
        assert r.num_output_tokens == expected
        assert r.output_token_ids == [FILLER + k for k in range(expected)]
        assert r.block_ids == []
    assert not sched.running
    assert not sched.waiting
    assert not sched.requests
    assert kv.num_used_blocks == 0


def test_request_outgrowing_the_whole_pool_still_terminates():
    sched, kv = make_sched(num_blocks=4, block_size=4, max_model_len=100)  # 12 slots
    req = make_req("r", 5, arrival=0, max_tokens=None)
    sched.add_request(req)
    run_to_completion(sched, max_steps=200)
    assert req.is_finished and req.finish_reason == "length"
    assert kv.num_used_blocks == 0
