"""The KV block pool: reference-counted blocks, an O(1) LRU free queue, the hash -> block map.

Pure Python. Block 0 is the null block (padding writes there); it is never handed out. A block
with ref_cnt 0 sits in the free queue; if it still carries a hash it stays reusable by a prefix
hit until it is evicted, least recently freed first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

NULL_BLOCK = 0


class KVBlock:
    """One block's bookkeeping; prev/next link it into the free queue while ref_cnt == 0."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev", "next")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: bytes | None = None
        self.prev: KVBlock | None = None
        self.next: KVBlock | None = None


class LazyBlocks(Sequence):
    """Blocks 0..count-1 by id, each KVBlock made on first access: a pool of a million blocks
    (a small model's CPU budget) costs nothing until its blocks are used."""

    def __init__(self, count: int) -> None:
        self._made: list[KVBlock | None] = [None] * count

    def __len__(self) -> int:
        return len(self._made)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        block = self._made[index]
        if block is None:
            block = self._made[index] = KVBlock(range(len(self))[index])
        return block


class FreeBlockQueue:
    """Free blocks: the never-used ones first (in id order, taken by a counter), then a doubly
    linked list of freed ones: pop from the head (least recently freed), append at the tail,
    remove from the middle (a prefix hit on a free cached block), all O(1)."""

    def __init__(self, blocks: Sequence[KVBlock], fresh: range) -> None:
        """fresh: the ids of `blocks` never handed out, all free."""
        self._blocks, self._fresh = blocks, iter(fresh)
        self._num_fresh = len(fresh)
        self._head = KVBlock(-1)  # sentinels
        self._tail = KVBlock(-1)
        self._head.next, self._tail.prev = self._tail, self._head
        self.num_free = self._num_fresh

    def append(self, block: KVBlock) -> None:
        """Put block at the tail: it becomes the most recently freed."""
        last = self._tail.prev
        assert last is not None
        block.prev, block.next = last, self._tail
        last.next = self._tail.prev = block
        self.num_free += 1

    def remove(self, block: KVBlock) -> None:
        """Take block out from wherever it sits; RuntimeError if it is not queued."""
        if block.prev is None or block.next is None:
            raise RuntimeError(f"block {block.block_id} is not in the free queue")
        block.prev.next, block.next.prev = block.next, block.prev
        block.prev = block.next = None
        self.num_free -= 1

    def popleft(self) -> KVBlock:
        """Take a never-used block, else the least recently freed; RuntimeError when none is
        free."""
        if self._num_fresh:
            self._num_fresh -= 1
            self.num_free -= 1
            return self._blocks[next(self._fresh)]
        first = self._head.next
        if first is self._tail or first is None:
            raise RuntimeError("no free blocks")
        self.remove(first)
        return first

    def __iter__(self):
        fresh_start = len(self._blocks) - self._num_fresh
        yield from self._blocks[fresh_start:]
        node = self._head.next
        while node is not self._tail and node is not None:
            yield node
            node = node.next


class BlockPool:
    """Blocks 1..num_blocks-1 with reference counts and the hash -> block prefix-cache map."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (one is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.blocks = LazyBlocks(num_blocks)
        self.free_queue = FreeBlockQueue(self.blocks, range(1, num_blocks))
        self.cached: dict[bytes, KVBlock] = {}
        self.num_evictions = 0

    @property
    def num_free(self) -> int:
        """Blocks with no owner, including cached ones still reusable by a prefix hit."""
        return self.free_queue.num_free

    @property
    def num_used(self) -> int:
        """Blocks with at least one owner (the null block is never counted)."""
        return self.num_blocks - 1 - self.free_queue.num_free

    def allocate(self, count: int) -> list[int]:
        """count fresh blocks (ref_cnt 1), evicting the least recently freed cached ones."""
        if count > self.num_free:
            raise RuntimeError(f"asked for {count} blocks, {self.num_free} free")
        block_ids = []
        for _ in range(count):
            block = self.free_queue.popleft()
            self._evict(block)
            block.ref_cnt = 1
            block_ids.append(block.block_id)
        return block_ids

    def touch(self, block_ids: Iterable[int]) -> None:
        """Take a reference on cached blocks (a prefix hit); free ones leave the free queue."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference each; blocks reaching 0 join the free queue's tail in the given
        order (callers pass a request's blocks tail first, so its prefix is evicted last)."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_cnt <= 0 or block_id == NULL_BLOCK:
                raise RuntimeError(f"block {block_id} freed while not held (double free)")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue.append(block)

    def lookup(self, block_hash: bytes) -> int | None:
        """The block caching block_hash, or None (no reference is taken)."""
        block = self.cached.get(block_hash)
        return None if block is None else block.block_id

    def cache(self, block_id: int, block_hash: bytes) -> None:
        """Record that block_id holds the KV of block_hash (first writer wins on duplicates)."""
        block = self.blocks[block_id]
        if block.block_hash is None and block_hash not in self.cached:
            block.block_hash = block_hash
            self.cached[block_hash] = block

    def uncache(self, block_id: int) -> None:
        """Forget block_id's hash (its contents are not to be trusted)."""
        self._evict(self.blocks[block_id], counted=False)

    def _evict(self, block: KVBlock, counted: bool = True) -> None:
        if block.block_hash is None:
            return
        if self.cached.get(block.block_hash) is block:
            del self.cached[block.block_hash]
        block.block_hash = None
        self.num_evictions += counted

    def reset_cache(self) -> None:
        """Drop every cached hash (e.g. after weights change); blocks in use are unaffected."""
        for block in list(self.cached.values()):
            self.uncache(block.block_id)
