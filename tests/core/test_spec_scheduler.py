"""SpecScheduler driven by fake verify steps: draft slots within max_model_len, max_tokens and
the token budget, rollback of rejected drafts, stops inside the accepted tokens, no prefix-cache
publication of rejected tokens, preemption with drafts, and the acceptance counters."""

from __future__ import annotations

from compiled_llm.config import SchedulerConfig
from compiled_llm.core.kv_cache_manager import KVCacheManager
from compiled_llm.core.request import Request, RequestStatus
from compiled_llm.core.spec_scheduler import SpecScheduler
from compiled_llm.sampling_params import SamplingParams

BLOCK = 4


def make(num_blocks=64, k=3, lookahead=0, prefix_caching=True, **cfg):
    kv = KVCacheManager(num_blocks, BLOCK, enable_prefix_caching=prefix_caching)
    return SpecScheduler(SchedulerConfig(**cfg), kv, k, lookahead), kv


def req(rid="a", prompt_len=6, **params):
    params.setdefault("max_tokens", 32)
    params.setdefault("ignore_eos", True)
    return Request(rid, list(range(10, 10 + prompt_len)), SamplingParams(**params),
                   eos_token_ids=(2,))


def step(sched, tokens_of, drafts_of=lambda r: []):
    """Schedule, 'run', resolve: tokens_of(req, num_new) gives the step's token(s)."""
    out = sched.schedule()
    sched.advance(out)
    sampled = {}
    for r, num_new in out.scheduled:
        if r.num_computed_tokens >= len(r.all_token_ids):
            sampled[r.request_id] = tokens_of(r, num_new)
    sched.resolve(out, sampled)
    sched.set_drafts({r.request_id: drafts_of(r) for r, _ in out.scheduled})
    return out


def test_drafts_are_scheduled_and_rolled_back():
    sched, kv = make()
    r = req()
    sched.add_request(r)
    step(sched, lambda r, n: 100, lambda r: [7, 8, 9])  # prefill samples 100; drafts proposed
    assert r.num_computed_tokens == 6 and r.spec_token_ids == [7, 8, 9]
    out = step(sched, lambda r, n: [7, 55])  # 1 of 3 drafts accepted, then 55
    assert out.scheduled[0][1] == 4  # the last token and 3 drafts in one step
    assert r.output_token_ids == [100, 7, 55]
    assert r.num_computed_tokens == len(r.all_token_ids) - 1 == 8  # rolled back
    assert len(r.block_ids) == 3  # slots for 10 tokens: kept, overwritten next step
    stats = sched.spec_stats
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (1, 3, 1)
    assert stats.accepted_per_pos == [1, 0, 0]
    sched.finish(r, RequestStatus.FINISHED_ABORTED)
    assert kv.num_used_blocks == 0


def _verified(k: int, drafts: list[int], verified: list[int]):
    """A request of 7 prompt tokens that sampled 100, proposed drafts and verified them."""
    sched, kv = make(k=k)
    r = req(prompt_len=7)
    sched.add_request(r)
    step(sched, lambda r, n: 100, lambda r: drafts)
    step(sched, lambda r, n: verified, lambda r: [5])
    return sched, kv, r


def _cached_blocks(kv, tokens: list[int]) -> int:
    twin = req("b", prompt_len=7)
    twin.all_token_ids = tokens
    return len(kv.get_computed_blocks(twin))


def test_rejected_tokens_are_never_published():
    # drafts at positions 8..11 fill block 2 whole; all are rejected
    sched, kv, r = _verified(4, [201, 202, 203, 204], [300])
    sched.schedule()  # the next step's allocation publishes what is full of known tokens
    assert len(r.block_hashes) == len(r.all_token_ids) // BLOCK == 2
    # blocks 0, 1 (known tokens) only
    assert _cached_blocks(kv, list(range(10, 17)) + [100, 201, 202, 203, 204, 1]) == 2
    sched.finish(r, RequestStatus.FINISHED_ABORTED)
    assert kv.num_used_blocks == 0


def test_blocks_filled_by_accepted_drafts_are_published():
    drafts = list(range(200, 208))
    sched, kv, r = _verified(8, drafts, drafts + [300])  # all 8 accepted: positions 8..15
    assert _cached_blocks(kv, list(r.all_token_ids) + [1]) == 4  # blocks 0..3
    sched.finish(r, RequestStatus.FINISHED_ABORTED)
    assert kv.num_used_blocks == 0


def test_drafts_trimmed_to_max_tokens_max_model_len_and_budget():
    sched, _ = make(k=5, max_model_len=12, max_num_batched_tokens=64)
    a = req("a", prompt_len=6, max_tokens=3)
    sched.add_request(a)
    step(sched, lambda r, n: 100, lambda r: [1, 2, 3, 4, 5])
    out = sched.schedule()
    assert out.scheduled[0][1] == 2 and a.spec_token_ids == [1]  # 1 output + 1 draft + 1 < 3
    sched.finish(a, RequestStatus.FINISHED_ABORTED)
    b = req("b", prompt_len=8, max_tokens=20)
    sched.add_request(b)
    step(sched, lambda r, n: 100, lambda r: [1, 2, 3, 4, 5])
    out = sched.schedule()  # 9 tokens known, max_model_len 12: at most 2 drafts
    assert out.scheduled[0][1] == 3 and b.spec_token_ids == [1, 2]
    sched.finish(b, RequestStatus.FINISHED_ABORTED)
    tight, _ = make(k=5, max_num_batched_tokens=3, max_num_seqs=4)
    c = req("c", prompt_len=3)
    tight.add_request(c)
    step(tight, lambda r, n: 100, lambda r: [1, 2, 3, 4, 5])
    assert tight.schedule().scheduled[0][1] == 3  # the budget: the last token and 2 drafts


def test_stop_inside_accepted_tokens_drops_the_rest():
    sched, kv = make()
    r = req(stop_token_ids=[8])
    sched.add_request(r)
    step(sched, lambda r, n: 100, lambda r: [7, 8, 9])
    step(sched, lambda r, n: [7, 8, 9, 60])
    assert r.output_token_ids == [100, 7, 8] and r.status is RequestStatus.FINISHED_STOPPED
    m = req("m", max_tokens=3)
    sched.add_request(m)
    step(sched, lambda r, n: 100, lambda r: [7, 8, 9])
    step(sched, lambda r, n: [7, 8, 9, 60])  # more than fits: cut at max_tokens
    assert m.output_token_ids == [100, 7, 8] and m.status is RequestStatus.FINISHED_LENGTH
    assert kv.num_used_blocks == 0


def test_preemption_drops_drafts_and_recomputes():
    sched, kv = make(num_blocks=8, k=3)  # 7 usable blocks of 4 tokens
    a, b = req("a", prompt_len=10), req("b", prompt_len=10)
    sched.add_request(a)
    sched.add_request(b)
    step(sched, lambda r, n: 100, lambda r: [1, 2, 3])
    preempted = 0
    for _ in range(12):
        out = step(sched, lambda r, n: [1, 2, 3, 4][:n], lambda r: [1, 2, 3])
        preempted += out.num_preempted
        for r, _ in out.scheduled:
            assert r.num_computed_tokens <= len(r.all_token_ids)
        if not sched.has_unfinished():
            break
    assert preempted > 0
    for r in (a, b):
        if not r.is_finished:
            sched.finish(r, RequestStatus.FINISHED_ABORTED)
    assert kv.num_used_blocks == 0


def test_lookahead_slots_are_reserved():
    sched, kv = make(k=3, lookahead=3)
    r = req(prompt_len=4)
    sched.add_request(r)
    sched.schedule()  # admission: 4 prompt tokens + 3 lookahead slots
    assert len(r.block_ids) == 2
    sched.finish(r, RequestStatus.FINISHED_ABORTED)
    r = req("b", prompt_len=4)
    sched.add_request(r)
    step(sched, lambda r, n: 100, lambda r: [1, 2, 3])
    sched.schedule()  # 4 computed + 4 new + 3 lookahead = 11 slots: 3 blocks
    assert len(r.block_ids) == 3
    edge, _ = make(k=3, lookahead=3, max_model_len=10)
    long = req("c", prompt_len=8)
    edge.add_request(long)
    edge.schedule()  # never past max_model_len: 8 + 2 slots, 3 blocks at most
    assert len(long.block_ids) == 3


def test_disable_by_batch_size_drops_drafts_and_keeps_pending_tokens():
    kv = KVCacheManager(64, BLOCK)
    sched = SpecScheduler(SchedulerConfig(), kv, 3, disable_by_batch_size=2)
    first, second = req("a"), req("b")
    sched.add_request(first)
    assert sched.plan_speculation()
    step(sched, lambda r, n: 100, lambda r: [7, 8])
    sched.add_request(second)
    assert not sched.plan_speculation()  # two requests: at the limit
    sched.speculating = False
    out = sched.schedule()
    assert dict((r.request_id, n) for r, n in out.scheduled)["a"] == 1  # drafts dropped
    assert first.spec_token_ids == []
    sched.advance(out, [r for r, _ in out.scheduled])  # launched async: tokens pending
    assert first.num_pending == 1 and first.num_computed_tokens == 7
    sched.resolve(out, {"a": 55, "b": 101})
    assert first.num_pending == 0 and first.output_token_ids == [100, 55]
    assert first.num_computed_tokens == 7  # not rolled back: only verify steps roll back
    for r in (first, second):
        sched.finish(r, RequestStatus.FINISHED_ABORTED)
    assert kv.num_used_blocks == 0


def test_fruitless_steps_pause_speculation_with_backoff():
    kv = KVCacheManager(64, BLOCK)
    sched = SpecScheduler(SchedulerConfig(), kv, 3, pause_when_fruitless=True)
    r = req(max_tokens=64)
    sched.add_request(r)

    def plans(num):
        return [sched.plan_speculation() for _ in range(num)]

    assert sched.plan_speculation()
    step(sched, lambda r, n: 100)  # no drafts found: pause 1 step
    assert plans(2) == [False, True]
    step(sched, lambda r, n: 101)  # fruitless again: the pause doubles
    assert plans(3) == [False, False, True]
    step(sched, lambda r, n: 102, lambda r: [7, 8])  # drafts to verify: fruitful
    assert sched.plan_speculation()
    step(sched, lambda r, n: [55], lambda r: [9])  # all rejected: fruitless, pause 1 again
    assert plans(2) == [False, True]
    step(sched, lambda r, n: [9, 56], lambda r: [1])  # accepted one: no pause
    assert plans(2) == [True, True]
    sched.finish(r, RequestStatus.FINISHED_ABORTED)
    assert kv.num_used_blocks == 0


def test_no_fruitless_pause_while_a_seeded_request_is_live():
    # a seeded request's tokens must not depend on its batch: a pause (decided by the whole
    # batch) would change which of its steps verify drafts, and so its random draws
    kv = KVCacheManager(64, BLOCK)
    sched = SpecScheduler(SchedulerConfig(), kv, 3, pause_when_fruitless=True)
    plain, seeded = req("plain", max_tokens=64), req("seeded", temperature=1.0, seed=5)
    sched.add_request(plain)
    sched.add_request(seeded)
    step(sched, lambda r, n: 100)  # no drafts found: fruitless
    assert sched.plan_speculation() and sched.plan_speculation()
    sched.finish(seeded, RequestStatus.FINISHED_ABORTED)
    assert not sched.plan_speculation()  # the pause holds again once the seed is gone
    sched.finish(plain, RequestStatus.FINISHED_ABORTED)
    assert kv.num_used_blocks == 0
