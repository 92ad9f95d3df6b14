"""The block pool: fixed-size KV blocks with refcounts, a prefix-cache index and an LRU free queue.

Every block id in `1 .. num_blocks - 1` is in exactly one of two states:

- in use: `ref_counts[b] > 0`; held by that many block-table entries (shared prefix blocks and
  forked requests hold the same block, copy-free);
- free: `ref_counts[b] == 0` and `b` is in the free queue.

Block 0 is the NULL block: it stands in block tables for entries that hold nothing (sliding-window
blocks that left the window). It is never allocated, never freed, never cached.

A block becomes a prefix-cache entry when its tokens are all computed: `cache_block` records the
key `(group, block_hash)` plus the block's parent hash and token ids. A cached block whose refcount
drops to 0 keeps its content and its key: it waits at the tail of the free queue, and a later
request with the same prefix takes it back with `touch` (a hit). `allocate` takes blocks from the
head of the queue; taking a cached block there evicts its key. So the free queue IS the eviction
order: uncached blocks go to the head (nothing is lost by reusing them first), cached blocks to the
tail (least recently freed are evicted first). Callers free a request's blocks last-block-first,
since a later block of a prefix is useless once an earlier one is evicted.

The queue is an OrderedDict: pop from the head, append, move to the head and remove from the middle
are all O(1) and run in C.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

NULL_BLOCK_ID = 0

# (group index, block hash): the prefix-cache key of a block.
BlockKey = tuple[int, int]


class NoFreeBlocksError(RuntimeError):
    """Asked for more blocks than the free queue holds (callers check `num_free_blocks` first)."""


@dataclass(slots=True)
class PrefixCacheStats:
    """Counters since the last reset. Queries and hits are counted in tokens and in requests."""

    num_requests: int = 0
    num_hit_requests: int = 0
    num_queried_tokens: int = 0
    num_hit_tokens: int = 0
    num_evicted_blocks: int = 0

    @property
    def hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_queried_tokens if self.num_queried_tokens else 0.0

    def record(self, num_queried_tokens: int, num_hit_tokens: int) -> None:
        self.num_requests += 1
        self.num_hit_requests += num_hit_tokens > 0
        self.num_queried_tokens += num_queried_tokens
        self.num_hit_tokens += num_hit_tokens


class BlockPool:
    """`num_blocks` KV blocks (block 0 is the null block). All operations are O(blocks touched)."""

    __slots__ = (
        "num_blocks",
        "enable_caching",
        "ref_counts",
        "stats",
        "_free",
        "_keys",
        "_parents",
        "_tokens",
        "_cached",
    )

    def __init__(self, num_blocks: int, *, enable_caching: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError(
                f"a block pool needs at least 2 blocks (one is the null block), got {num_blocks}"
            )
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.ref_counts = [0] * num_blocks
        self.stats = PrefixCacheStats()
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))
        # Per block: its prefix-cache key, parent hash and token ids while it is cached.
        self._keys: list[BlockKey | None] = [None] * num_blocks
        self._parents: list[int] = [0] * num_blocks
        self._tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self._cached: dict[BlockKey, int] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def is_cached(self, block_id: int) -> bool:
        return self._keys[block_id] is not None

    def allocate(self, num_blocks: int) -> list[int]:
        """Take `num_blocks` blocks from the head of the free queue (evicting their cache keys)."""
        free = self._free
        if num_blocks > len(free):
            raise NoFreeBlocksError(f"asked for {num_blocks} blocks, {len(free)} are free")
        ref_counts, keys = self.ref_counts, self._keys
        block_ids = []
        for _ in range(num_blocks):
            block_id = free.popitem(last=False)[0]
            if keys[block_id] is not None:
                self._evict(block_id)
            ref_counts[block_id] = 1
            block_ids.append(block_id)
        return block_ids

    def touch(self, block_ids: Iterable[int]) -> None:
        """Add one reference to each block (a prefix-cache hit or a fork); revives free blocks."""
        ref_counts, free = self.ref_counts, self._free
        for block_id in block_ids:
            if block_id == NULL_BLOCK_ID:
                continue
            if ref_counts[block_id] == 0:
                del free[block_id]
            ref_counts[block_id] += 1

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference to each block, in the given order (the first is evicted first)."""
        ref_counts, free, keys = self.ref_counts, self._free, self._keys
        for block_id in block_ids:
            if block_id == NULL_BLOCK_ID:
                continue
            count = ref_counts[block_id] - 1
            if count < 0:
                raise RuntimeError(f"block {block_id} freed more often than it was taken")
            ref_counts[block_id] = count
            if count == 0:
                free[block_id] = None
                if keys[block_id] is None:
                    # Holds nothing worth keeping: hand it out before any cached block.
                    free.move_to_end(block_id, last=False)

    def cache_block(
        self,
        block_id: int,
        group: int,
        block_hash: int,
        parent_hash: int,
        token_ids: tuple[int, ...],
    ) -> bool:
        """Make a full, computed block findable by its key. False when caching is off, the block
        is already cached, or another block already holds that key (two requests computed the
        same block at once; the first one stays the cache entry)."""
        key = (group, block_hash)
        if not self.enable_caching or self._keys[block_id] is not None or key in self._cached:
            return False
        self._cached[key] = block_id
        self._keys[block_id] = key
        self._parents[block_id] = parent_hash
        self._tokens[block_id] = token_ids
        return True

    def lookup(
        self, group: int, block_hash: int, parent_hash: int, token_ids: tuple[int, ...]
    ) -> int | None:
        """The cached block of `group` holding exactly these tokens after this parent, or None.

        NOTE: the hash only finds a candidate; the stored parent hash and token ids confirm it, so
        a hash collision can never hand a request someone else's KV."""
        block_id = self._cached.get((group, block_hash))
        if block_id is None:
            return None
        if self._parents[block_id] != parent_hash or self._tokens[block_id] != token_ids:
            return None
        return block_id

    def reset_prefix_cache(self) -> int:
        """Forget every cache entry (in-use blocks keep their content but are no longer findable).
        Returns the number of entries dropped."""
        num_dropped = len(self._cached)
        for block_id in list(self._cached.values()):
            self._uncache(block_id)
        return num_dropped

    def _evict(self, block_id: int) -> None:
        self._uncache(block_id)
        self.stats.num_evicted_blocks += 1

    def _uncache(self, block_id: int) -> None:
        key = self._keys[block_id]
        if key is not None:
            del self._cached[key]
        self._keys[block_id] = None
        self._tokens[block_id] = None

    def free_block_ids(self) -> list[int]:
        """The free queue, head (next to be handed out) first. For tests and debugging."""
        return list(self._free)

    def check_invariants(self) -> None:
        """Raise AssertionError when the pool's bookkeeping is inconsistent (tests call this)."""
        assert self.ref_counts[NULL_BLOCK_ID] == 0, "the null block has references"
        assert NULL_BLOCK_ID not in self._free, "the null block is in the free queue"
        assert self._keys[NULL_BLOCK_ID] is None, "the null block is cached"
        for block_id in range(1, self.num_blocks):
            count = self.ref_counts[block_id]
            assert count >= 0, f"block {block_id} has refcount {count}"
            assert (count == 0) == (block_id in self._free), (
                f"block {block_id}: refcount {count} but in free queue: {block_id in self._free}"
            )
        for key, block_id in self._cached.items():
            assert self._keys[block_id] == key, f"cache index of block {block_id} is stale"
        num_keyed = sum(key is not None for key in self._keys)
        assert num_keyed == len(self._cached), "a block has a key that the index lacks"
