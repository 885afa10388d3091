"""Chained block hashes for prefix caching: hash(parent hash, the block's token ids, extra keys).

Extra keys carry whatever else changes a block's KV (a LoRA id; the first block: a cache_salt),
so two blocks share a hash only if their whole prefix and everything that shapes it match.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Sequence

import xxhash

from compiled_llm.config import PREFIX_CACHING_HASH_ALGOS as HASH_ALGOS

ROOT_HASH = b"compiled-llm-prefix-root"  # the parent of every first block


def _xxhash(data: bytes) -> bytes:
    return xxhash.xxh3_128_digest(data)


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def hash_fn(algo: str) -> Callable[[bytes], bytes]:
    """The digest function for prefix_caching_hash_algo."""
    if algo == "xxhash":
        return _xxhash
    if algo == "sha256":
        return _sha256
    raise ValueError(f"prefix_caching_hash_algo must be one of {HASH_ALGOS}, got {algo!r}")


def hash_block(digest: Callable[[bytes], bytes], parent: bytes, token_ids: Sequence[int],
               extra_keys: tuple = ()) -> bytes:
    """One block's hash; equal hashes mean equal KV (same tokens after the same prefix)."""
    tokens = array("q", token_ids).tobytes()
    extra = repr(extra_keys).encode() if extra_keys else b""
    # lengths make the concatenation unambiguous
    header = len(parent).to_bytes(2, "little") + len(tokens).to_bytes(4, "little")
    return digest(header + parent + tokens + extra)


def extend_block_hashes(digest: Callable[[bytes], bytes], block_hashes: list[bytes],
                        token_ids: Sequence[int], block_size: int,
                        extra_keys: tuple = (), num_tokens: int | None = None,
                        cache_salt: str | None = None) -> None:
    """Append the hashes of the full blocks of token_ids[:num_tokens] not hashed yet (in
    place, incremental: earlier hashes are never recomputed); cache_salt, when given, is
    mixed into the first block's hash."""
    end = len(token_ids) if num_tokens is None else min(num_tokens, len(token_ids))
    parent = block_hashes[-1] if block_hashes else ROOT_HASH
    for start in range(len(block_hashes) * block_size, end - block_size + 1, block_size):
        keys = extra_keys
        if start == 0 and cache_salt is not None:
            keys = (*extra_keys, ("cache_salt", cache_salt))
        parent = hash_block(digest, parent, token_ids[start : start + block_size], keys)
        block_hashes.append(parent)
