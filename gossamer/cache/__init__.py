"""Paged KV cache bookkeeping: block pool, prefix cache, per-request block tables per cache group.

See `layout.py` (groups and memory), `block_pool.py` (refcounts, free queue, prefix-cache index)
and `manager.py` (block tables, sliding-window release, prefix hits, fork, rollback).
"""

from gossamer.cache.block_pool import (
    NULL_BLOCK_ID,
    BlockPool,
    NoFreeBlocksError,
    PrefixCacheStats,
)
from gossamer.cache.layout import (
    KVCacheGroupSpec,
    KVCacheLayout,
    dtype_num_bytes,
    kv_block_bytes,
    num_blocks_for_memory,
)
from gossamer.cache.manager import CacheRequest, KVCacheManager, PrefixHit

__all__ = [
    "NULL_BLOCK_ID",
    "BlockPool",
    "CacheRequest",
    "KVCacheGroupSpec",
    "KVCacheLayout",
    "KVCacheManager",
    "NoFreeBlocksError",
    "PrefixCacheStats",
    "PrefixHit",
    "dtype_num_bytes",
    "kv_block_bytes",
    "num_blocks_for_memory",
]
