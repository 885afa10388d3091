"""Stateful property tests of the scheduler and KV cache manager together: random arrivals
(with shared prefixes, so prefix hits), steps, stops, aborts (also mid-step) and forced
preemptions, under both policies. After every rule: no block leaked, shared without a
reference, or freed twice; budgets held. At the end every request not aborted has finished
and the pool is empty."""

from __future__ import annotations

from collections import Counter

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from compiled_llm.config import SchedulerConfig
from compiled_llm.core.block_pool import NULL_BLOCK
from compiled_llm.core.kv_cache_manager import KVCacheManager
from compiled_llm.core.request import Request, RequestStatus
from compiled_llm.core.scheduler import Scheduler
from compiled_llm.sampling_params import SamplingParams
from tests.core.test_scheduler import complete_step

BS = 4
EOS = 2
PREFIXES = [[10 + (i * 7 + k) % 5 for i in range(20)] for k in range(3)]  # few distinct tokens


class KVSchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sched: Scheduler
        self.kv: KVCacheManager
        self.reqs: list[Request] = []
        self.aborted: set[str] = set()
        self.stop_next: set[str] = set()

    @initialize(policy=st.sampled_from(["fcfs", "priority"]), budget=st.integers(4, 24),
                seqs=st.integers(1, 5))
    def configure(self, policy, budget, seqs):
        # 11 usable blocks = 44 slots >= max_model_len: any one request always fits alone
        self.kv = KVCacheManager(12, BS, enable_prefix_caching=True)
        cfg = SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=budget,
                              max_model_len=40, scheduling_policy=policy)
        self.sched = Scheduler(cfg, self.kv)

    @rule(prefix=st.integers(0, 2), plen=st.integers(0, 20),
          tail=st.lists(st.integers(3, 9), max_size=12), max_tokens=st.integers(1, 10),
          priority=st.integers(0, 2))
    def arrive(self, prefix, plen, tail, max_tokens, priority):
        prompt = PREFIXES[prefix][:plen] + tail or [5]
        r = Request(f"r{len(self.reqs)}", prompt, SamplingParams(max_tokens=max_tokens),
                    eos_token_ids=(EOS,), arrival_time=float(len(self.reqs)), priority=priority)
        self.sched.add_request(r)
        self.reqs.append(r)

    @rule(abort_mid=st.booleans(), pick=st.integers(0, 1000))
    def step(self, abort_mid, pick):
        out = self.sched.schedule()
        self._check_step(out)
        if abort_mid and out.scheduled:  # the client leaves while the model runs
            victim = out.scheduled[pick % len(out.scheduled)][0]
            self._abort(victim)
        sampled = {r.request_id: self._token(r) for r, n in out.scheduled
                   if r.num_computed_tokens + n == r.num_tokens}
        complete_step(self.sched, out, sampled)
        if out.num_preempted:
            event("preempted")

    @precondition(lambda self: self.sched.running)
    @rule(pick=st.integers(0, 1000))
    def stop_soon(self, pick):
        """The running request's next token is EOS."""
        self.stop_next.add(self.sched.running[pick % len(self.sched.running)].request_id)

    @precondition(lambda self: self.sched.requests)
    @rule(pick=st.integers(0, 1000))
    def abort(self, pick):
        live = list(self.sched.requests.values())
        self._abort(live[pick % len(live)])

    @precondition(lambda self: self.sched.running)
    @rule(pick=st.integers(0, 1000))
    def preempt(self, pick):
        self.sched.preempt(self.sched.running[pick % len(self.sched.running)])

    def _abort(self, r: Request) -> None:
        if self.sched.abort(r.request_id) is not None:
            self.aborted.add(r.request_id)

    def _token(self, r: Request) -> int:
        if r.request_id in self.stop_next:
            self.stop_next.discard(r.request_id)
            return EOS
        return 100 + r.num_output_tokens % 3  # repeats, so generated blocks get hits too

    def _check_step(self, out) -> None:
        cfg = self.sched.cfg
        assert out.total_tokens <= cfg.max_num_batched_tokens
        assert len(out.scheduled) <= cfg.max_num_seqs
        assert len({r.request_id for r, _ in out.scheduled}) == len(out.scheduled)
        for r, n in out.scheduled:
            assert n >= 1 and r.num_computed_tokens + n <= r.num_tokens
            assert len(r.block_ids) * BS >= r.num_computed_tokens + n
        if self.kv.stats.hit_blocks:
            event("prefix hit")

    @invariant()
    def blocks_are_accounted_for(self):
        pool = self.kv.pool
        holders = Counter(b for r in self.sched.running for b in r.block_ids)
        assert NULL_BLOCK not in holders
        assert len(self.sched.running) <= self.sched.cfg.max_num_seqs
        for block in pool.blocks[1:]:
            assert block.ref_cnt >= 0
            assert block.ref_cnt == holders.get(block.block_id, 0), "leaked or shared unrefd"
        free = [b.block_id for b in pool.free_queue]
        assert len(free) == len(set(free)) == pool.num_free
        assert set(free) == {b.block_id for b in pool.blocks[1:] if b.ref_cnt == 0}
        assert pool.num_used == len(holders)
        for h, block in pool.cached.items():
            assert block.block_hash == h
        for r in self.reqs:
            if r not in self.sched.running:
                assert r.block_ids == []

    def teardown(self):
        if not hasattr(self, "sched"):
            return
        for _ in range(2000):
            if not self.sched.has_unfinished():
                break
            self.step(abort_mid=False, pick=0)
        assert not self.sched.has_unfinished(), "a request never finished"
        for r in self.reqs:
            assert r.is_finished
            if r.request_id in self.aborted:
                assert r.status is RequestStatus.FINISHED_ABORTED
            else:
                assert r.finish_reason in ("stop", "length")
        assert self.kv.num_used_blocks == 0
        assert all(b.ref_cnt == 0 for b in self.kv.pool.blocks)


KVSchedulerMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None)
TestKVScheduler = KVSchedulerMachine.TestCase
