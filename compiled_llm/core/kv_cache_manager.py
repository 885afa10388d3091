"""KV cache manager: the blocks each request's tokens need, cached prefix reuse, block release.

Pure Python. A block is cached (hash -> block) when a step is scheduled to fill it; a new or
preempted request first takes the longest run of cached full blocks matching its tokens, always
leaving at least one token to compute so the step has logits to sample from.
"""

from __future__ import annotations

from dataclasses import dataclass

from compiled_llm.core.block_pool import NULL_BLOCK, BlockPool
from compiled_llm.core.prefix_hash import extend_block_hashes, hash_fn
from compiled_llm.core.request import Request

__all__ = ["NULL_BLOCK", "BlockPool", "KVCacheManager", "PrefixCacheStats"]


@dataclass
class PrefixCacheStats:
    """Cumulative prefix-cache counters over admitted lookups (one per admission)."""

    requests: int = 0
    queried_tokens: int = 0
    hit_tokens: int = 0
    queried_blocks: int = 0  # full blocks of the looked-up requests
    hit_blocks: int = 0

    @property
    def token_hit_rate(self) -> float:
        """Fraction of looked-up tokens served from the cache (0.0 before any lookup)."""
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    @property
    def block_hit_rate(self) -> float:
        """Fraction of looked-up full blocks served from the cache (0.0 before any lookup)."""
        return self.hit_blocks / self.queried_blocks if self.queried_blocks else 0.0


def _ceil_div(count: int, size: int) -> int:
    return -(-count // size)


class KVCacheManager:
    """Block lists of requests over one BlockPool, with automatic prefix caching."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 hash_algo: str = "xxhash") -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.enable_prefix_caching = enable_prefix_caching
        self._digest = hash_fn(hash_algo)
        self.stats = PrefixCacheStats()

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by requests; cached blocks nobody holds count as free."""
        return self.pool.num_used

    @property
    def usage(self) -> float:
        """Fraction of allocatable blocks (all but the null block) held by requests."""
        return self.pool.num_used / max(1, self.pool.num_blocks - 1)

    def blocks_needed(self, req: Request, num_new_tokens: int) -> int:
        """New blocks req needs to hold num_new_tokens more tokens (0 if it has room)."""
        total = req.num_computed_tokens + num_new_tokens
        return max(0, _ceil_div(total, self.block_size) - len(req.block_ids))

    def can_ever_fit(self, num_tokens: int) -> bool:
        """Whether num_tokens fit the whole pool (a request alone could hold them)."""
        return _ceil_div(num_tokens, self.block_size) <= self.pool.num_blocks - 1

    # ------------------------------------------------------------------ prefix lookups
    def _hash_blocks(self, req: Request, num_tokens: int) -> None:
        # an adapter changes every block's KV: its id joins the hash; a cache_salt joins the
        # first block's (and so every later one's, through the chain)
        lora = req.lora_request
        keys = (() if lora is None else (lora.lora_int_id,)) + (
            ("long_rope",) if req.long_rope else ())  # RoPE's long rows: other K/V
        extend_block_hashes(self._digest, req.block_hashes, req.all_token_ids, self.block_size,
                            keys, num_tokens, req.cache_salt)

    def get_computed_blocks(self, req: Request) -> list[int]:
        """Cached blocks matching req's leading full blocks (no references taken). Capped so
        at least one token is left to compute: a fully cached prompt recomputes its last
        block rather than write into a shared one."""
        if not self.enable_prefix_caching or req.skips_prefix_cache:
            return []
        self._hash_blocks(req, req.num_tokens)
        hits: list[int] = []
        for block_hash in req.block_hashes[: (req.num_tokens - 1) // self.block_size]:
            block_id = self.pool.lookup(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def _record_lookup(self, req: Request, num_hit_blocks: int) -> None:
        stats = self.stats
        stats.requests += 1
        stats.queried_tokens += req.num_tokens
        stats.hit_tokens += num_hit_blocks * self.block_size
        stats.queried_blocks += req.num_tokens // self.block_size
        stats.hit_blocks += num_hit_blocks

    # ------------------------------------------------------------------ allocation
    def allocate_slots(self, req: Request, num_new_tokens: int,
                       computed_blocks: list[int] | None = None) -> bool:
        """Grow req.block_ids to hold num_new_tokens more tokens; False (and no change) if the
        pool is short. computed_blocks (from get_computed_blocks, for a request holding no
        blocks) are taken first and advance req.num_computed_tokens past them."""
        hits = computed_blocks or []
        if not hits and req.block_ids:  # the common case (decode): no lookup, maybe no block
            return self._grow(req, num_new_tokens)
        if hits and (req.block_ids or req.num_computed_tokens):
            raise RuntimeError("computed_blocks are only for a request that holds no blocks")
        total = req.num_computed_tokens + len(hits) * self.block_size + num_new_tokens
        need = max(0, _ceil_div(total, self.block_size) - len(req.block_ids) - len(hits))
        # hits sitting in the free queue stop being allocatable once taken
        reclaimed = sum(1 for block_id in hits if self.pool.blocks[block_id].ref_cnt == 0)
        if need > self.pool.num_free - reclaimed:
            return False
        if req.num_cached_tokens < 0:  # its first admission
            req.num_cached_tokens = len(hits) * self.block_size
        if self.enable_prefix_caching and not req.block_ids and not req.skips_prefix_cache:
            self._record_lookup(req, len(hits))
        self.pool.touch(hits)
        req.block_ids.extend(hits)
        req.num_computed_tokens += len(hits) * self.block_size
        req.block_ids.extend(self.pool.allocate(need))
        self._cache_full_blocks(req, req.num_computed_tokens + num_new_tokens)
        return True

    def _grow(self, req: Request, num_new_tokens: int) -> bool:
        """allocate_slots for a request that already holds blocks and takes no cached ones."""
        total = req.num_computed_tokens + num_new_tokens
        need = _ceil_div(total, self.block_size) - len(req.block_ids)
        if need > 0:
            if need > self.pool.num_free:
                return False
            req.block_ids.extend(self.pool.allocate(need))
        self._cache_full_blocks(req, total)
        return True

    def _cache_full_blocks(self, req: Request, num_tokens: int) -> None:
        """Publish the blocks this step fills (their KV is written before anyone reads it)."""
        if not self.enable_prefix_caching:
            return
        # only known tokens can be hashed: slots reserved ahead, or a token a launched step is
        # still sampling (async scheduling), are published by a later step
        num_tokens = min(num_tokens, len(req.all_token_ids))
        # from the block of the last computed token: under async scheduling its token may have
        # become known only now (cache() skips blocks already published)
        first = max(req.num_computed_tokens - 1, 0) // self.block_size
        if num_tokens // self.block_size <= first:
            return  # this step fills no block (hashes are extended when one is filled)
        self._hash_blocks(req, num_tokens)
        for i in range(first, num_tokens // self.block_size):
            self.pool.cache(req.block_ids[i], req.block_hashes[i])

    def cache_computed_blocks(self, req: Request, first_block: int) -> None:
        """Publish req's full blocks from first_block on whose tokens are known and computed
        (speculative decoding: a verify step can fill several blocks with accepted drafts)."""
        if not self.enable_prefix_caching:
            return
        num_tokens = min(req.num_computed_tokens, len(req.all_token_ids))
        self._hash_blocks(req, num_tokens)
        for i in range(first_block, num_tokens // self.block_size):
            self.pool.cache(req.block_ids[i], req.block_hashes[i])

    # ------------------------------------------------------------------ release
    def free(self, req: Request) -> None:
        """Return req's blocks; cached ones stay reusable until evicted (tail blocks first)."""
        self.pool.free(reversed(req.block_ids))
        req.block_ids = []

    def drop_uncomputed(self, req: Request) -> None:
        """Forget the hashes of blocks a failed step was to fill: their KV is not trustworthy."""
        for block_id in req.block_ids[req.num_computed_tokens // self.block_size :]:
            self.pool.uncache(block_id)

    def reset_prefix_cache(self) -> None:
        """Forget every cached block hash; blocks held by requests stay theirs."""
        self.pool.reset_cache()
