"""Paged KV bookkeeping: BlockPool free list (block 0 reserved) and KVCacheManager slot growth."""

import pytest

from compiled_llm.core.kv_cache_manager import NULL_BLOCK, BlockPool, KVCacheManager
from compiled_llm.core.request import Request
from compiled_llm.sampling_params import SamplingParams


def make_req(rid: str = "r", num_prompt: int = 4) -> Request:
    return Request(rid, list(range(num_prompt)), SamplingParams())


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ----------------------------------------------------------------------------- BlockPool
@pytest.mark.parametrize("num_blocks", [-1, 0, 1])
def test_pool_needs_a_block_besides_the_null_block(num_blocks):
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(num_blocks)


def test_pool_starts_with_every_block_but_the_null_block_free():
    pool = BlockPool(6)
    assert pool.num_free == 5
    assert pool.num_used == 0


def test_pool_never_hands_out_the_null_block():
    pool = BlockPool(8)
    blocks = pool.allocate(7)
    assert NULL_BLOCK == 0
    assert sorted(blocks) == list(range(1, 8))
    assert pool.num_free == 0
    assert pool.num_used == 7


def test_smallest_pool_hands_out_only_block_1():
    pool = BlockPool(2)
    assert pool.allocate(1) == [1]
    with pytest.raises(RuntimeError):
        pool.allocate(1)


def test_pool_allocate_zero_is_a_no_op():
    pool = BlockPool(4)
    assert pool.allocate(0) == []
    assert pool.num_free == 3


def test_pool_asking_for_too_many_raises_and_changes_nothing():
    pool = BlockPool(5)
    held = pool.allocate(2)
    with pytest.raises(RuntimeError, match="3 blocks, 2 free"):
        pool.allocate(3)
    assert pool.num_free == 2
    assert pool.num_used == 2
    # the two left are still there and distinct from the held ones
    rest = pool.allocate(2)
    assert set(rest).isdisjoint(held)
    assert sorted(held + rest) == [1, 2, 3, 4]


def test_pool_allocate_free_round_trip():
    pool = BlockPool(5)
    a = pool.allocate(3)
    assert (pool.num_free, pool.num_used) == (1, 3)
    pool.free(a)
    assert (pool.num_free, pool.num_used) == (4, 0)
    assert sorted(pool.allocate(4)) == [1, 2, 3, 4]


def test_pool_churn_never_duplicates_or_leaks_blocks():
    pool = BlockPool(9)
    held: list[list[int]] = []
    for step in range(200):
        if held and (step % 3 == 0 or pool.num_free == 0):
            pool.free(held.pop(step % len(held)))
        else:
            held.append(pool.allocate(min(pool.num_free, 1 + step % 3)))
        flat = [b for group in held for b in group]
        assert NULL_BLOCK not in flat
        assert len(flat) == len(set(flat))
        assert pool.num_used == len(flat)
        assert pool.num_free + pool.num_used == 8
    for group in held:
        pool.free(group)
    assert pool.num_used == 0


# ----------------------------------------------------------------------------- KVCacheManager
@pytest.mark.parametrize(
    ("computed", "held", "new", "expected"),
    [
        (0, 0, 0, 0),
        (0, 0, 1, 1),
        (0, 0, 4, 1),  # exactly one block
        (0, 0, 5, 2),  # one past the boundary
        (0, 0, 8, 2),
        (3, 1, 1, 0),  # fills the last slot of the held block
        (4, 1, 1, 1),  # first token of a new block
        (4, 1, 4, 1),
        (4, 1, 5, 2),
        (7, 2, 9, 2),  # 16 tokens -> 4 blocks
        (2, 3, 1, 0),  # already holds more than it needs: never negative
    ],
)
def test_blocks_needed_is_ceil_of_total_minus_held(computed, held, new, expected):
    kv = KVCacheManager(num_blocks=16, block_size=4)
    req = make_req(num_prompt=20)
    req.block_ids = kv.pool.allocate(held)
    req.num_computed_tokens = computed
    assert kv.blocks_needed(req, new) == expected


@pytest.mark.parametrize(
    ("computed", "held", "new"),
    [(0, 0, 1), (0, 0, 4), (0, 0, 5), (3, 1, 1), (4, 1, 1), (5, 2, 11), (8, 2, 8), (0, 0, 0)],
)
def test_allocate_slots_grows_by_exactly_the_blocks_needed(computed, held, new):
    bs = 4
    kv = KVCacheManager(num_blocks=16, block_size=bs)
    req = make_req(num_prompt=32)
    req.block_ids = kv.pool.allocate(held)
    req.num_computed_tokens = computed
    before = list(req.block_ids)
    free_before = kv.pool.num_free

    assert kv.allocate_slots(req, new) is True

    grown = ceil_div(computed + new, bs) - held
    assert len(req.block_ids) == held + grown
    assert req.block_ids[:held] == before  # existing blocks kept, in order
    assert kv.pool.num_free == free_before - grown
    assert NULL_BLOCK not in req.block_ids
    assert len(req.block_ids) * bs >= computed + new
    assert req.num_computed_tokens == computed  # allocation does not advance progress


def test_allocate_slots_uses_the_last_free_block():
    kv = KVCacheManager(num_blocks=3, block_size=4)  # 2 usable blocks = 8 slots
    req = make_req()
    assert kv.allocate_slots(req, 8) is True
    assert sorted(req.block_ids) == [1, 2]
    assert kv.pool.num_free == 0


def test_allocate_slots_returns_false_and_changes_nothing_when_short():
    kv = KVCacheManager(num_blocks=3, block_size=4)  # 2 usable blocks
    req = make_req()
    assert kv.allocate_slots(req, 9) is False  # 3 blocks
    assert req.block_ids == []
    assert kv.num_used_blocks == 0


def test_allocate_slots_partial_shortage_keeps_existing_blocks():
    kv = KVCacheManager(num_blocks=4, block_size=4)  # 3 usable blocks
    other = make_req("other")
    assert kv.allocate_slots(other, 4)
    req = make_req("req")
    assert kv.allocate_slots(req, 4)
    held = list(req.block_ids)
    req.num_computed_tokens = 4
    assert kv.allocate_slots(req, 5) is False  # needs 2 more, 1 free
    assert req.block_ids == held
    assert kv.pool.num_free == 1
    assert kv.allocate_slots(req, 4) is True  # 1 more fits
    assert kv.pool.num_free == 0


def test_requests_never_share_blocks():
    kv = KVCacheManager(num_blocks=13, block_size=2)
    reqs = [make_req(str(i)) for i in range(3)]
    for n in (3, 1, 4):
        for r in reqs:
            assert kv.allocate_slots(r, n)
            r.num_computed_tokens += n
    flat = [b for r in reqs for b in r.block_ids]
    assert len(flat) == len(set(flat)) == 12  # 3 requests x ceil(8 / 2)
    assert kv.num_used_blocks == 12
    assert kv.pool.num_free == 0


def test_free_returns_every_block_and_clears_the_request():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    a, b = make_req("a"), make_req("b")
    assert kv.allocate_slots(a, 10)
    assert kv.allocate_slots(b, 5)
    assert kv.num_used_blocks == 5
    kv.free(a)
    assert a.block_ids == []
    assert kv.num_used_blocks == 2
    kv.free(b)
    assert b.block_ids == []
    assert kv.num_used_blocks == 0
    assert kv.pool.num_free == 9


def test_free_twice_does_not_double_free():
    kv = KVCacheManager(num_blocks=6, block_size=4)
    req = make_req()
    assert kv.allocate_slots(req, 12)
    kv.free(req)
    kv.free(req)
    assert kv.num_used_blocks == 0
    assert kv.pool.num_free == 5
    blocks = kv.pool.allocate(5)
    assert len(set(blocks)) == 5


def test_usage_fraction():
    kv = KVCacheManager(num_blocks=5, block_size=4)  # 4 usable
    assert kv.usage == 0.0
    req = make_req()
    assert kv.allocate_slots(req, 8)
    assert kv.usage == pytest.approx(0.5)
    assert kv.allocate_slots(req, 16)
    assert kv.usage == pytest.approx(1.0)
    kv.free(req)
    assert kv.usage == 0.0


@pytest.mark.parametrize(
    ("num_tokens", "fits"),
    [(0, True), (1, True), (15, True), (16, True), (17, False), (100, False)],
)
def test_can_ever_fit_block_boundaries(num_tokens, fits):
    kv = KVCacheManager(num_blocks=5, block_size=4)  # 4 usable blocks = 16 slots
    assert kv.can_ever_fit(num_tokens) is fits


def test_can_ever_fit_ignores_current_usage():
    kv = KVCacheManager(num_blocks=5, block_size=4)
    req = make_req()
    assert kv.allocate_slots(req, 16)
    assert kv.can_ever_fit(16)
    kv.free(req)
