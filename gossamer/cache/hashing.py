"""Chained block hashes for prefix caching.

The hash of full block j covers every token before it: `hash_j = hash((hash_{j-1}, tokens_j))`,
starting from a seed derived from the request's cache salt (requests with different salts never
share blocks). The cache group is not part of the chain; it is part of the pool's key, so one chain
serves every group.

Python's `hash` of a tuple of ints does not depend on PYTHONHASHSEED, so the chain is the same in
every process of one Python version (a router on another host can recompute it). The salt string
goes through sha256 first, because `hash(str)` is randomised per process.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def salt_seed(cache_salt: str | None) -> int:
    """The parent hash of block 0: 0 without a salt, a 64-bit digest of the salt otherwise."""
    if not cache_salt:
        return 0
    digest = hashlib.sha256(cache_salt.encode()).digest()
    return int.from_bytes(digest[:8], "little", signed=True)


def hash_block(parent_hash: int, token_ids: tuple[int, ...]) -> int:
    return hash((parent_hash, token_ids))


def extend_block_hashes(
    block_hashes: list[int],
    token_ids: Sequence[int],
    num_full_blocks: int,
    block_size: int,
    cache_salt: str | None,
) -> None:
    """Append to `block_hashes` the hashes of blocks `len(block_hashes) .. num_full_blocks - 1`
    of `token_ids` (which must hold at least `num_full_blocks * block_size` tokens)."""
    start = len(block_hashes)
    if start >= num_full_blocks:
        return
    parent = block_hashes[-1] if block_hashes else salt_seed(cache_salt)
    for block in range(start, num_full_blocks):
        first = block * block_size
        parent = hash((parent, tuple(token_ids[first : first + block_size])))
        block_hashes.append(parent)
