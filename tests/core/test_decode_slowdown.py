"""The prefill cap that bounds inter-token latency: the step cost model's estimates, and the
scheduler holding steps with decodes to the cap (waiting and running prompts alike) while a
step without decodes keeps the whole token budget."""

from __future__ import annotations

import pytest

from compiled_llm.config import EngineArgs, SchedulerConfig
from compiled_llm.core.step_cost import MIN_CAP, StepCostModel
from tests.core.test_scheduler import fake_step, layout, make_req, make_sched, run_to_completion


def test_cost_model_learns_decode_time_and_prefill_token_cost():
    model = StepCostModel(2.5)
    assert model.prefill_cap() is None
    model.observe(decodes=256, prefill_tokens=0, seconds=0.006)
    assert model.prefill_cap() is None  # no prefill cost seen yet
    model.observe(decodes=100, prefill_tokens=8192, seconds=0.006 + 8192 * 3e-6)
    # a step may take 1.5 decode steps of prefill: 0.009 s / 3 us a token
    assert model.prefill_cap() == pytest.approx(3000, abs=1)
    model.observe(decodes=0, prefill_tokens=8192, seconds=1.0)  # no decodes: says nothing
    model.observe(decodes=5, prefill_tokens=500, seconds=1.0)  # too few tokens to count
    assert model.prefill_cap() == pytest.approx(3000, abs=1)


def test_cost_model_never_caps_below_the_minimum():
    model = StepCostModel(1.1)
    model.observe(decodes=1, prefill_tokens=0, seconds=0.001)
    model.observe(decodes=1, prefill_tokens=2000, seconds=1.0)
    assert model.prefill_cap() == MIN_CAP


def test_a_step_with_decodes_takes_at_most_the_cap():
    sched, kv = make_sched(max_num_batched_tokens=64, num_blocks=128)
    sched.prefill_cap = 10
    a = make_req("a", 4, arrival=0, max_tokens=6)
    sched.add_request(a)
    out, _ = fake_step(sched)
    assert layout(out) == [("a", 4)]  # nothing decodes yet: no cap
    for k, size in enumerate((30, 30)):
        sched.add_request(make_req(f"p{k}", size, arrival=1 + k, max_tokens=1))
    out, _ = fake_step(sched)
    assert layout(out) == [("a", 1), ("p0", 10)]
    out, _ = fake_step(sched)
    assert layout(out) == [("a", 1), ("p0", 10)]  # a running prompt's chunk is capped too
    run_to_completion(sched)
    assert kv.num_used_blocks == 0


def test_without_a_cap_the_budget_alone_limits_prefill():
    sched, _ = make_sched(max_num_batched_tokens=64, num_blocks=128)
    sched.add_request(make_req("a", 4, arrival=0, max_tokens=6))
    fake_step(sched)
    sched.add_request(make_req("p", 30, arrival=1, max_tokens=1))
    out, _ = fake_step(sched)
    assert layout(out) == [("a", 1), ("p", 30)]


def test_capped_steps_keep_teaching_the_model():
    model = StepCostModel(2.5)
    model.observe(decodes=8, prefill_tokens=0, seconds=0.006)
    model.observe(decodes=8, prefill_tokens=1024, seconds=0.5)  # one slow first sample
    assert model.prefill_cap() == MIN_CAP
    for _ in range(40):  # steps at the cap are samples too: the estimate recovers
        cap = model.prefill_cap()
        model.observe(decodes=8, prefill_tokens=cap, seconds=0.006 + cap * 3e-6)
    assert model.prefill_cap() == pytest.approx(3000, rel=0.05)


def test_prompt_tokens_are_counted_where_they_are_scheduled():
    sched, _ = make_sched(max_num_batched_tokens=64, num_blocks=128)
    sched.add_request(make_req("a", 4, arrival=0, max_tokens=6))
    out, _ = fake_step(sched)
    assert (out.num_prefill_tokens, out.num_prefill_reqs) == (4, 1)
    sched.add_request(make_req("p", 30, arrival=1, max_tokens=1))
    out, _ = fake_step(sched)
    assert (out.num_prefill_tokens, out.num_prefill_reqs) == (30, 1)  # a's decode is not


def test_without_chunked_prefill_a_prompt_is_never_capped():
    sched, _ = make_sched(max_num_batched_tokens=64, num_blocks=128,
                          enable_chunked_prefill=False, max_model_len=64)
    sched.prefill_cap = 10
    sched.add_request(make_req("a", 4, arrival=0, max_tokens=6))
    fake_step(sched)
    sched.add_request(make_req("p", 30, arrival=1, max_tokens=1))
    out, _ = fake_step(sched)
    assert layout(out) == [("a", 1), ("p", 30)]  # whole: a cap would hold the queue back


def test_a_recompute_after_preemption_is_capped_like_a_prompt():
    sched, _ = make_sched(max_num_batched_tokens=64, num_blocks=128)
    a = make_req("a", 4, arrival=0, max_tokens=20)
    b = make_req("b", 4, arrival=1, max_tokens=20)
    sched.add_request(a)
    sched.add_request(b)
    for _ in range(12):
        fake_step(sched)
    sched.preempt(b)  # b recomputes its prompt and 12 outputs beside a's decodes
    sched.prefill_cap = 5
    out, _ = fake_step(sched)
    assert layout(out) == [("a", 1), ("b", 5)]


@pytest.mark.parametrize("bad", [1.0, 0.5, -2, float("inf")])
def test_bad_slowdowns_are_refused(bad):
    with pytest.raises(ValueError, match="max_decode_slowdown"):
        EngineArgs(max_decode_slowdown=bad)
    with pytest.raises(ValueError, match="max_decode_slowdown"):
        SchedulerConfig(max_decode_slowdown=bad)


def test_zero_turns_the_cap_off():
    assert EngineArgs(max_decode_slowdown=0).scheduler_config(4096).max_decode_slowdown is None
    assert EngineArgs(max_decode_slowdown=2.5).scheduler_config(4096).max_decode_slowdown == 2.5
