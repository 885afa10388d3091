"""Automatic prefix caching: the block pool's LRU free queue and ref counts, chained block
hashes, cache hits in the KV manager, and the same greedy output with caching on and off."""

from __future__ import annotations

import pytest

from compiled_llm import LLM, SamplingParams
from compiled_llm.config import EngineArgs
from compiled_llm.core.block_pool import BlockPool
from compiled_llm.core.kv_cache_manager import KVCacheManager
from compiled_llm.core.prefix_hash import ROOT_HASH, extend_block_hashes, hash_block, hash_fn
from compiled_llm.core.request import Request
from tests.utils import make_checkpoint, random_prompts

BS = 4


def req(rid: str, tokens: list[int], **params) -> Request:
    return Request(rid, list(tokens), SamplingParams(**params))


def admit(kv: KVCacheManager, r: Request) -> int:
    """Look up, allocate the rest of the prompt, 'compute' it; returns the hit tokens."""
    hits = kv.get_computed_blocks(r)
    assert kv.allocate_slots(r, r.num_tokens - len(hits) * BS, hits)
    hit_tokens = r.num_computed_tokens
    r.num_computed_tokens = r.num_tokens
    return hit_tokens


# ----------------------------------------------------------------------------- block pool
def test_free_queue_evicts_least_recently_freed_cached_block_first():
    pool = BlockPool(5)
    a = pool.allocate(4)
    for i, b in enumerate(a):
        pool.cache(b, bytes([i]))
    pool.free([a[2], a[0], a[3], a[1]])
    assert pool.num_used == 0 and len(pool.cached) == 4  # free, still reusable
    assert pool.allocate(1) == [a[2]]
    assert pool.lookup(bytes([2])) is None  # evicted
    assert pool.lookup(bytes([0])) == a[0] and pool.num_evictions == 1


def test_touching_a_free_cached_block_takes_it_out_of_the_queue():
    pool = BlockPool(4)
    a = pool.allocate(3)
    pool.cache(a[1], b"x")
    pool.free(a)
    pool.touch([a[1]])  # a prefix hit from the middle of the queue
    assert pool.blocks[a[1]].ref_cnt == 1 and pool.num_free == 2
    assert sorted(pool.allocate(2)) == sorted([a[0], a[2]])
    with pytest.raises(RuntimeError, match="2 free|0 free"):
        pool.allocate(1)
    pool.touch([a[1]])
    pool.free([a[1]])
    assert pool.num_used == 3  # one ref left
    pool.free([a[1]])
    with pytest.raises(RuntimeError, match="double free"):
        pool.free([a[1]])


def test_first_writer_keeps_a_duplicate_hash():
    pool = BlockPool(4)
    a, b = pool.allocate(2)
    pool.cache(a, b"h")
    pool.cache(b, b"h")
    assert pool.lookup(b"h") == a and pool.blocks[b].block_hash is None
    pool.uncache(a)
    assert pool.lookup(b"h") is None


# ----------------------------------------------------------------------------- hashes
@pytest.mark.parametrize("algo", ["xxhash", "sha256"])
def test_block_hashes_chain_through_the_prefix(algo):
    d = hash_fn(algo)
    one = hash_block(d, ROOT_HASH, [1, 2, 3, 4])
    assert one == hash_block(d, ROOT_HASH, [1, 2, 3, 4])
    assert one != hash_block(d, ROOT_HASH, [1, 2, 3, 5])
    assert hash_block(d, one, [5, 6, 7, 8]) != hash_block(d, ROOT_HASH, [5, 6, 7, 8])
    assert one != hash_block(d, ROOT_HASH, [1, 2, 3, 4], ("lora", 7))  # extra keys count
    hashes: list[bytes] = []
    extend_block_hashes(d, hashes, list(range(10)), 4, num_tokens=6)
    assert len(hashes) == 1
    extend_block_hashes(d, hashes, list(range(10)), 4)
    assert hashes == [hash_block(d, ROOT_HASH, [0, 1, 2, 3]),
                      hash_block(d, hashes[0], [4, 5, 6, 7])]


def test_a_cache_salt_joins_the_first_block_hash_only():
    d = hash_fn("xxhash")
    plain: list[bytes] = []
    salted: list[bytes] = []
    extend_block_hashes(d, plain, list(range(12)), 4)
    extend_block_hashes(d, salted, list(range(8)), 4, cache_salt="s")
    extend_block_hashes(d, salted, list(range(12)), 4, cache_salt="s")  # incremental
    assert salted[0] == hash_block(d, ROOT_HASH, [0, 1, 2, 3], (("cache_salt", "s"),))
    assert salted[1:] == [hash_block(d, salted[0], [4, 5, 6, 7]),
                          hash_block(d, salted[1], [8, 9, 10, 11])]  # chained, unsalted
    assert all(a != b for a, b in zip(plain, salted))


def test_requests_share_blocks_only_with_the_same_salt():
    kv = KVCacheManager(32, BS)
    tokens = list(range(1, 11))  # 2 full blocks reusable

    def salted(rid: str, salt: str | None) -> Request:
        r = req(rid, tokens)
        r.cache_salt = salt
        return r

    reqs = [salted("a", "A"), salted("b", "A"), salted("c", "B"), salted("d", None),
            salted("e", None)]
    assert [admit(kv, r) for r in reqs] == [0, 8, 0, 0, 8]
    assert reqs[1].block_ids[:2] == reqs[0].block_ids[:2]
    assert not set(reqs[2].block_ids) & set(reqs[0].block_ids + reqs[3].block_ids)
    for r in reqs:
        kv.free(r)
    assert kv.num_used_blocks == 0


def test_unknown_hash_algo_is_a_clear_error():
    with pytest.raises(ValueError, match="prefix_caching_hash_algo"):
        EngineArgs(prefix_caching_hash_algo="md5")


# ----------------------------------------------------------------------------- manager
def test_a_freed_prefix_is_hit_by_the_next_request():
    kv = KVCacheManager(16, BS)
    a = req("a", range(1, 11))  # 10 tokens: 2 full blocks
    assert admit(kv, a) == 0
    a_blocks = list(a.block_ids)
    kv.free(a)
    assert kv.num_used_blocks == 0
    b = req("b", [*range(1, 9), 99, 98, 97])  # shares the 2 full blocks
    assert admit(kv, b) == 8
    assert b.block_ids[:2] == a_blocks[:2] and b.block_hashes[:2] == a.block_hashes[:2]
    s = kv.stats
    assert (s.hit_tokens, s.queried_tokens, s.hit_blocks, s.queried_blocks) == (8, 21, 2, 4)
    assert s.block_hit_rate == 0.5


@pytest.mark.parametrize("length", [8, 9, 12])
def test_a_fully_cached_prompt_still_computes_its_last_token(length):
    kv = KVCacheManager(16, BS)
    tokens = list(range(1, length + 1))
    a = req("a", tokens)
    admit(kv, a)
    b = req("b", tokens)
    hit = admit(kv, b)
    assert hit == (length - 1) // BS * BS  # on a block boundary the last block is recomputed
    assert hit < length
    assert b.block_ids[: hit // BS] == a.block_ids[: hit // BS]
    for bid in b.block_ids[: hit // BS]:
        assert kv.pool.blocks[bid].ref_cnt == 2
    kv.free(a)
    kv.free(b)
    assert kv.num_used_blocks == 0


def test_blocks_filled_by_generated_tokens_are_cached():
    kv = KVCacheManager(16, BS)
    a = req("a", [1, 2, 3])
    admit(kv, a)
    for t in (4, 5, 6):
        a.append_token(t)
        assert kv.allocate_slots(a, 1)
        a.num_computed_tokens += 1
    assert len(kv.pool.cached) == 1  # [1, 2, 3, 4] filled during decode
    kv.free(a)
    b = req("b", [1, 2, 3, 4, 5])
    assert admit(kv, b) == 4


def test_prompt_logprobs_requests_skip_the_cache():
    kv = KVCacheManager(16, BS)
    admit(kv, req("a", range(1, 10)))
    b = req("b", range(1, 10), prompt_logprobs=1)
    assert kv.get_computed_blocks(b) == []
    assert kv.stats.requests == 1


def test_blocks_of_a_failed_step_are_not_kept_cached():
    kv = KVCacheManager(16, BS)
    a = req("a", range(1, 6))
    admit(kv, a)  # block [1..4] computed
    a.append_token(6)
    a.append_token(7)
    a.append_token(8)
    assert kv.allocate_slots(a, 3)  # this step fills block [5..8]
    assert len(kv.pool.cached) == 2
    kv.drop_uncomputed(a)  # ... but the step failed
    kv.free(a)
    b = req("b", range(1, 10))
    assert admit(kv, b) == 4


def test_disabled_caching_never_hits():
    kv = KVCacheManager(16, BS, enable_prefix_caching=False)
    a = req("a", range(1, 10))
    admit(kv, a)
    kv.free(a)
    assert admit(kv, req("b", range(1, 10))) == 0
    assert not kv.pool.cached and kv.stats.requests == 0


def test_hits_on_free_blocks_count_against_the_free_pool():
    kv = KVCacheManager(4, BS)  # 3 usable blocks
    a = req("a", range(1, 10))  # 3 blocks, 2 of them full
    admit(kv, a)
    kv.free(a)
    b = req("b", [*range(1, 9), *range(50, 58)])  # hits 2, needs 2 more: 4 > 3
    hits = kv.get_computed_blocks(b)
    assert len(hits) == 2
    assert not kv.allocate_slots(b, 8, hits)
    assert b.block_ids == [] and b.num_computed_tokens == 0 and kv.num_used_blocks == 0


# ----------------------------------------------------------------------------- engine
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def ckpt():
    return make_checkpoint("llama")


def shared_prefix_prompts() -> list[dict]:
    """Shared prefixes of 32 tokens (2 blocks of 16) with endings on and off block
    boundaries, an exact repeat, and a prompt that is a cached prefix of another."""
    system = random_prompts(1, 300, lo=32, hi=33, seed=1)[0]
    tails = random_prompts(6, 300, lo=1, hi=40, seed=2)
    prompts = [system + t for t in tails]
    prompts += [system, system + tails[0], system[:16], system + tails[1][:16]]
    return [{"prompt_token_ids": p} for p in prompts]


def _run(ckpt, prompts, **kw):
    llm = LLM(str(ckpt), enforce_eager=True, dtype="float32", **kw)
    outs = []
    for _ in range(2):  # the second pass hits blocks the first one left cached
        outs.append([o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY,
                                                                  use_tqdm=False)])
    assert llm.engine.num_used_blocks == 0
    return outs, llm.engine


@pytest.fixture(scope="module")
def baseline(ckpt):
    outs, eng = _run(ckpt, shared_prefix_prompts(), enable_prefix_caching=False)
    assert outs[0] == outs[1] and eng.prefix_cache_stats.requests == 0
    return outs[0]


@pytest.mark.parametrize("kw", [
    {},
    {"max_num_batched_tokens": 24},  # chunked prefill across cached blocks
    {"num_gpu_blocks_override": 12, "max_num_seqs": 4},  # forced preemption
    {"prefix_caching_hash_algo": "sha256", "max_num_seqs": 2},
], ids=["plain", "chunked", "preempt", "sha256"])
def test_same_greedy_output_with_prefix_caching(ckpt, baseline, kw):
    outs, eng = _run(ckpt, shared_prefix_prompts(), **kw)
    assert outs == [baseline, baseline]
    s = eng.prefix_cache_stats
    assert s.hit_blocks > 0 and 0 < s.token_hit_rate < 1
    if "num_gpu_blocks_override" in kw:
        assert eng.scheduler.num_preemptions > 0
    assert eng.kv.pool.cached  # free cached blocks remain after the run
