"""Paged KV cache bookkeeping: a pool of fixed-size blocks and per-request block lists.

Pure Python; never touches the device. Block 0 is the null block: padded tokens write there and
it is never handed out. Allocate and free are O(1) per block.
"""

from __future__ import annotations

from collections import deque

from compiled_llm.request import Request

NULL_BLOCK = 0


class BlockPool:
    """Free list of block ids 1..num_blocks-1."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (one is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(1, num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - 1 - len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} blocks, {len(self._free)} free")
        return [self._free.popleft() for _ in range(n)]

    def free(self, block_ids: list[int]) -> None:
        # reversed: the most recently used blocks are reused last (kinder to later caching)
        self._free.extend(reversed(block_ids))


class KVCacheManager:
    """Gives requests the blocks their tokens need, and takes them back."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_used

    @property
    def usage(self) -> float:
        return self.pool.num_used / max(1, self.pool.num_blocks - 1)

    def blocks_needed(self, req: Request, num_new_tokens: int) -> int:
        total = req.num_computed_tokens + num_new_tokens
        return max(0, -(-total // self.block_size) - len(req.block_ids))

    def can_ever_fit(self, num_tokens: int) -> bool:
        return -(-num_tokens // self.block_size) <= self.pool.num_blocks - 1

    def allocate_slots(self, req: Request, num_new_tokens: int) -> bool:
        """Grow req.block_ids to hold num_new_tokens more tokens; False (and no change) if the
        pool is short."""
        need = self.blocks_needed(req, num_new_tokens)
        if need > self.pool.num_free:
            return False
        req.block_ids.extend(self.pool.allocate(need))
        return True

    def free(self, req: Request) -> None:
        self.pool.free(req.block_ids)
        req.block_ids = []
