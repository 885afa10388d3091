"""Scheduling policies: fcfs and priority order, who is preempted when blocks run out, and no
starvation of a long request under a steady stream of short ones."""

from __future__ import annotations

import pytest

from compiled_llm import LLM, SamplingParams
from compiled_llm.config import SchedulerConfig
from compiled_llm.core.request import RequestStatus
from tests.core.test_scheduler import fake_step, make_req, make_sched, run_to_completion
from tests.utils import make_checkpoint, random_prompts


def first_step(outs, req) -> int:
    return next(i for i, o in enumerate(outs) if any(r is req for r, _ in o.scheduled))


def test_unknown_policy_is_a_clear_error():
    with pytest.raises(ValueError, match="scheduling_policy"):
        SchedulerConfig(scheduling_policy="lifo")


def test_priority_admits_lower_values_first_and_ties_by_arrival():
    sched, kv = make_sched(max_num_seqs=1, scheduling_policy="priority")
    reqs = [make_req(f"r{i}", 5, arrival=i, max_tokens=2) for i in range(5)]
    for r, prio in zip(reqs, [3, 1, 2, 1, 0]):
        r.priority = prio
        sched.add_request(r)
    outs = run_to_completion(sched)
    order = sorted(reqs, key=lambda r: first_step(outs, r))
    assert [r.request_id for r in order] == ["r4", "r1", "r3", "r2", "r0"]
    assert kv.num_used_blocks == 0


def test_fcfs_ignores_priority_and_keeps_arrival_order():
    sched, kv = make_sched(max_num_seqs=1)
    reqs = [make_req(f"r{i}", 5, arrival=i, max_tokens=2) for i in range(4)]
    for r, prio in zip(reqs, [3, 1, 2, 0]):
        r.priority = prio
        sched.add_request(r)
    outs = run_to_completion(sched)
    assert sorted(reqs, key=lambda r: first_step(outs, r)) == reqs
    assert kv.num_used_blocks == 0


@pytest.mark.parametrize(("policy", "victim"), [("fcfs", "b"), ("priority", "a")])
def test_preemption_picks_the_newest_or_the_least_urgent(policy, victim):
    # 4 usable blocks of 4 slots; both 6-token prompts hold 2 blocks and then need a third
    sched, kv = make_sched(num_blocks=5, block_size=4, scheduling_policy=policy)
    a = make_req("a", 6, arrival=0, max_tokens=6)
    b = make_req("b", 6, arrival=1, max_tokens=6)
    a.priority, b.priority = 5, 0  # the older request is the less urgent one
    sched.add_request(a)
    sched.add_request(b)
    while not sched.num_preemptions:
        fake_step(sched)
    assert sched.requests[victim].status is RequestStatus.PREEMPTED
    run_to_completion(sched)
    assert a.num_output_tokens == b.num_output_tokens == 6
    assert kv.num_used_blocks == 0


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("prefix_caching", [False, True])
def test_a_long_request_finishes_under_a_steady_stream(policy, prefix_caching):
    """A short request arrives every step, faster than they are served; a long one arrives
    once the queue is busy and still finishes, and so does every short one (same priority:
    arrival order decides)."""
    sched, kv = make_sched(num_blocks=17, block_size=4, max_num_seqs=4,
                           max_num_batched_tokens=8, max_model_len=64,
                           scheduling_policy=policy, prefix_caching=prefix_caching)
    long_req = make_req("long", 40, arrival=10.5, max_tokens=20)
    shorts = []
    step = 0
    while not long_req.is_finished:
        assert step < 400, "the long request starved"
        if step == 10:
            sched.add_request(long_req)
        short = make_req(f"s{step}", 3 + step % 5, arrival=step, max_tokens=2 + step % 3)
        sched.add_request(short)
        shorts.append(short)
        fake_step(sched)
        step += 1
    assert long_req.num_output_tokens == 20
    assert sum(s.is_finished for s in shorts) > 10  # the stream was served meanwhile
    assert len(shorts) - sum(s.is_finished for s in shorts) > 5  # and still queued up
    run_to_completion(sched)
    assert all(s.finish_reason == "length" for s in shorts)
    assert kv.num_used_blocks == 0


# ----------------------------------------------------------------------------- engine API
@pytest.fixture(scope="module")
def llm():
    return LLM(str(make_checkpoint("llama")), enforce_eager=True, dtype="float32",
               scheduling_policy="priority", max_num_seqs=2)


def test_generate_with_priority_matches_fcfs_output(llm):
    prompts = [{"prompt_token_ids": p} for p in random_prompts(5, 300, lo=5, hi=40, seed=3)]
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    plain = llm.generate(prompts, greedy, use_tqdm=False)
    ranked = llm.generate(prompts, greedy, use_tqdm=False, priority=[4, 0, 3, 1, 2])
    assert [o.outputs[0].token_ids for o in ranked] == [o.outputs[0].token_ids for o in plain]
    assert llm.engine.num_used_blocks == 0


def test_bad_priority_is_a_clear_error(llm):
    with pytest.raises(ValueError, match="priority"):
        llm.generate(["a", "b"], use_tqdm=False, priority=[1])
    with pytest.raises(ValueError, match="priority"):
        llm.engine.add_request("x", "a", priority="high")
    assert not llm.engine.has_unfinished_requests()


def test_priority_needs_the_priority_policy():
    fcfs = LLM(str(make_checkpoint("llama")), enforce_eager=True, dtype="float32")
    with pytest.raises(ValueError, match="scheduling_policy"):
        fcfs.generate("hello", use_tqdm=False, priority=[1])
    assert fcfs.engine.num_used_blocks == 0
