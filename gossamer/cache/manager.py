"""The KV cache manager: per-request block tables over one shared block pool.

A request has one block table per cache group (see `layout.py`): entry j of the table of group g is
the block holding positions `j * block_size .. (j + 1) * block_size - 1` for the layers of g, so
the slot of position p is `table[p // block_size] * block_size + p % block_size`.

Lifetime of a request's blocks, as the scheduler drives it:

1. `find_cached_prefix(request)` (waiting requests only): the longest prefix whose KV the cache
   already holds, as a `PrefixHit`. Full groups need every block of the prefix; a sliding group
   needs only the blocks that the window of the first new token can see (earlier entries are the
   null block); the request's hit is the minimum over groups. At least one token is always left to
   compute, since the model must run on the last token to produce logits.
2. `allocate_slots(request, num_new_tokens, prefix_hit)`: take the hit's blocks (refcount + 1, no
   copy) and enough new blocks to hold positions up to `num_computed_tokens + num_new_tokens`.
   All or nothing: returns False and changes nothing (except releasing blocks that left the
   window) when the pool cannot supply them; the scheduler then preempts someone.
   Before allocating, sliding groups release the blocks that no future query can see: the next
   query is at position p = num_computed_tokens and sees keys p - window + 1 .. p, so block j can go
   once (j + 1) * block_size <= p - window + 1. Doing this at p (before the step runs) keeps the
   blocks that a rollback of this step's draft tokens could still need. So while decoding, a
   sliding table holds at most cdiv(window - 1, block_size) + 1 blocks; during a prefill chunk of
   C tokens it also holds the chunk's blocks (`num_blocks_needed` accounts for that peak).
3. `cache_computed_blocks(request)` after each step: full blocks whose tokens are all computed get
   their chained hash and become prefix-cache entries. Registering only after the step means no
   request can ever hit a block whose KV is still being written.
4. `truncate(request_id, num_tokens)`: speculative-decoding rollback; blocks past the kept tokens
   go back to the pool.
5. `free(request_id)`: finished, aborted or preempted; every block loses one reference, cached
   ones stay findable in the free queue until someone else needs the space.

`fork(parent_id, child_id, num_tokens)` shares the parent's full computed blocks with a new request
(n > 1 sampling) by reference count; the child computes the rest itself.

NOTE: all tables of a request have the same length (a sliding table keeps null entries in front),
so one number says how far a request's tables reach.

The runner keeps its own copy of each table and receives only what changed:
`take_new_block_ids(request_id)` returns the index where new entries start and, per group, the new
entries. Entries a sliding group replaced by the null block are not re-sent, and after a rollback
the runner's copy may keep entries past the end; both are harmless because the runner only reads
entries inside the window of a query and below cdiv(sequence length, block_size).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gossamer.cache.block_pool import NULL_BLOCK_ID, BlockPool, PrefixCacheStats
from gossamer.cache.hashing import extend_block_hashes, salt_seed
from gossamer.cache.layout import KVCacheGroupSpec, KVCacheLayout


class CacheRequest(Protocol):
    """What the manager reads from a request (`gossamer.scheduler.request.Request` fits)."""

    request_id: str
    all_token_ids: list[int]
    num_computed_tokens: int
    cache_salt: str | None
    # Chained hashes of the request's full blocks; the manager appends to it lazily.
    block_hashes: list[int]


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """The cached prefix of a waiting request: `num_tokens` tokens (a multiple of the block size)
    and, per group, the block ids of its `num_tokens // block_size` table entries."""

    num_tokens: int
    num_queried_tokens: int
    block_ids: tuple[tuple[int, ...], ...]


class _RequestBlocks:
    """One request's tables and how far each bookkeeping pointer has got."""

    __slots__ = ("tables", "num_cached_blocks", "num_skipped_blocks", "num_synced_blocks")

    def __init__(self, tables: list[list[int]]) -> None:
        self.tables = tables  # per group: block id per logical block; all the same length
        self.num_cached_blocks = 0  # leading blocks already offered to the prefix cache
        self.num_skipped_blocks = [0] * len(tables)  # sliding groups: leading entries now NULL
        self.num_synced_blocks = 0  # leading entries the runner already has


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    """Block tables of all live requests over one `BlockPool` of `num_blocks` blocks."""

    def __init__(
        self,
        groups: Sequence[KVCacheGroupSpec],
        num_blocks: int,
        *,
        block_size: int = 16,
        enable_prefix_caching: bool = True,
    ) -> None:
        if not groups:
            raise ValueError("a KV cache needs at least one group")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.groups = tuple(groups)
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks, enable_caching=enable_prefix_caching)
        self._requests: dict[str, _RequestBlocks] = {}
        self._full_groups = [i for i, g in enumerate(self.groups) if g.sliding_window is None]
        self._sliding_groups = [
            (i, g.sliding_window) for i, g in enumerate(self.groups) if g.sliding_window is not None
        ]
        self._empty_tables = tuple(() for _ in self.groups)

    @classmethod
    def from_layout(
        cls,
        layout: KVCacheLayout,
        num_blocks: int,
        *,
        block_size: int = 16,
        enable_prefix_caching: bool = True,
    ) -> KVCacheManager:
        return cls(
            layout.groups,
            num_blocks,
            block_size=block_size,
            enable_prefix_caching=enable_prefix_caching,
        )

    # ---- sizes and stats -------------------------------------------------------------------

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def num_free_blocks(self) -> int:
        """Blocks that `allocate_slots` can hand out (cached-but-unused blocks included)."""
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of the usable blocks held by requests."""
        return 1.0 - self.pool.num_free_blocks / self.pool.num_usable_blocks

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        return self.pool.stats

    def take_prefix_cache_stats(self) -> PrefixCacheStats:
        """The counters since the last call (for periodic metrics), then start new ones."""
        stats, self.pool.stats = self.pool.stats, PrefixCacheStats()
        return stats

    def reset_prefix_cache(self) -> int:
        """Forget all prefix-cache entries (e.g. after new weights). Returns how many."""
        return self.pool.reset_prefix_cache()

    def num_blocks_needed(self, num_tokens: int, max_chunk_tokens: int) -> int:
        """The most blocks one request of `num_tokens` tokens holds at once when it is computed
        in chunks of at most `max_chunk_tokens` (a sliding group holds the window plus a chunk)."""
        num_full_blocks = _cdiv(num_tokens, self.block_size)
        total = 0
        for group in self.groups:
            window = group.sliding_window
            if window is None:
                total += num_full_blocks
            else:
                peak = _cdiv(window - 1 + max_chunk_tokens, self.block_size) + 1
                total += min(num_full_blocks, peak)
        return total

    def has_request(self, request_id: str) -> bool:
        return request_id in self._requests

    def block_tables(self, request_id: str) -> tuple[list[int], ...]:
        """The live block tables of a request, one per group (read them, do not modify them)."""
        state = self._requests.get(request_id)
        return tuple(state.tables) if state is not None else tuple([] for _ in self.groups)

    def num_held_blocks(self, request_id: str) -> tuple[int, ...]:
        """Per group, how many non-null blocks the request holds."""
        state = self._requests.get(request_id)
        if state is None:
            return tuple(0 for _ in self.groups)
        return tuple(
            len(table) - skipped
            for table, skipped in zip(state.tables, state.num_skipped_blocks, strict=True)
        )

    # ---- prefix cache lookup ---------------------------------------------------------------

    def find_cached_prefix(self, request: CacheRequest) -> PrefixHit:
        """The longest cached prefix of `request` usable by every group (see the module doc).
        Changes nothing: `allocate_slots(request, n, hit)` takes the blocks."""
        num_tokens = len(request.all_token_ids)
        if not self.enable_prefix_caching:
            return PrefixHit(0, num_tokens, self._empty_tables)
        max_blocks = (num_tokens - 1) // self.block_size  # always compute the last token
        extend_block_hashes(
            request.block_hashes,
            request.all_token_ids,
            max_blocks,
            self.block_size,
            request.cache_salt,
        )
        lookup = _Lookup(self.pool, request, self.block_size)
        num_hit = max_blocks
        found: dict[int, list[int]] = {}
        for group in self._full_groups:
            blocks: list[int] = []
            for block in range(num_hit):
                block_id = lookup(group, block)
                if block_id is None:
                    break
                blocks.append(block_id)
            found[group] = blocks
            num_hit = len(blocks)
        sliding_found: dict[int, dict[int, int]] = {}
        for group, window in self._sliding_groups:
            num_hit, sliding_found[group] = self._longest_window_hit(group, window, num_hit, lookup)
        return PrefixHit(
            num_hit * self.block_size, num_tokens, self._hit_tables(num_hit, found, sliding_found)
        )

    def _longest_window_hit(
        self, group: int, window: int, max_blocks: int, lookup: _Lookup
    ) -> tuple[int, dict[int, int]]:
        """Largest k <= max_blocks such that blocks first_window_block(k) .. k - 1 are all cached
        in `group`. Scans right to left and looks at each block at most once."""
        hits: dict[int, int] = {}
        end = max_blocks
        block = end - 1
        while end > 0:
            first = self._first_window_block(end * self.block_size, window)
            while block >= first:
                block_id = lookup(group, block)
                if block_id is None:
                    break
                hits[block] = block_id
                block -= 1
            if block < first:
                return end, hits
            end = block  # block `block` is missing: a usable prefix must end before it
            block = end - 1
        return 0, hits

    def _hit_tables(
        self, num_hit: int, found: dict[int, list[int]], sliding_found: dict[int, dict[int, int]]
    ) -> tuple[tuple[int, ...], ...]:
        tables = []
        for group, spec in enumerate(self.groups):
            if spec.sliding_window is None:
                tables.append(tuple(found[group][:num_hit]))
                continue
            first = self._first_window_block(num_hit * self.block_size, spec.sliding_window)
            hits = sliding_found[group]
            tables.append((NULL_BLOCK_ID,) * first + tuple(hits[j] for j in range(first, num_hit)))
        return tuple(tables)

    def _first_window_block(self, position: int, window: int) -> int:
        """Index of the first block a query at `position` can see through a sliding window."""
        return max(0, (position - window + 1) // self.block_size)

    # ---- allocation ------------------------------------------------------------------------

    def allocate_slots(
        self, request: CacheRequest, num_new_tokens: int, prefix_hit: PrefixHit | None = None
    ) -> bool:
        """Make room for `num_new_tokens` tokens after the request's computed ones (after the
        hit's tokens for a request without blocks: on success the caller sets
        `request.num_computed_tokens = prefix_hit.num_tokens`). All or nothing: False, with no
        block taken, when the pool is short."""
        state = self._requests.get(request.request_id)
        if state is None:
            return self._allocate_new(request, num_new_tokens, prefix_hit)
        if prefix_hit is not None:
            raise ValueError(f"request {request.request_id} already holds blocks; no prefix hit")
        start = request.num_computed_tokens
        if self._sliding_groups:
            self._release_left_window(state, start)
        tables = state.tables
        num_missing = -(-(start + num_new_tokens) // self.block_size) - len(tables[0])
        if num_missing <= 0:
            return True  # the common decode step: the last block still has room
        if num_missing * len(tables) > self.pool.num_free_blocks:
            return False
        for table in tables:
            table.extend(self.pool.allocate(num_missing))
        return True

    def _allocate_new(
        self, request: CacheRequest, num_new_tokens: int, prefix_hit: PrefixHit | None
    ) -> bool:
        if prefix_hit is None:
            if request.num_computed_tokens:
                raise ValueError(
                    f"request {request.request_id} has computed tokens but holds no blocks"
                )
            prefix_hit = PrefixHit(0, len(request.all_token_ids), self._empty_tables)
        state = _RequestBlocks([list(blocks) for blocks in prefix_hit.block_ids])
        ref_counts = self.pool.ref_counts
        num_revived = sum(
            ref_counts[block_id] == 0
            for blocks in prefix_hit.block_ids
            for block_id in blocks
            if block_id != NULL_BLOCK_ID
        )
        hit_blocks = prefix_hit.num_tokens // self.block_size
        num_missing = _cdiv(prefix_hit.num_tokens + num_new_tokens, self.block_size) - hit_blocks
        if num_missing * len(state.tables) + num_revived > self.pool.num_free_blocks:
            return False
        # Take the hit first: its free blocks must leave the queue, not be evicted by allocate.
        for blocks in prefix_hit.block_ids:
            self.pool.touch(blocks)
        if num_missing > 0:
            for table in state.tables:
                table.extend(self.pool.allocate(num_missing))
        state.num_cached_blocks = hit_blocks
        for group, window in self._sliding_groups:
            state.num_skipped_blocks[group] = min(
                hit_blocks, self._first_window_block(prefix_hit.num_tokens, window)
            )
        self._requests[request.request_id] = state
        if self.enable_prefix_caching:
            self.pool.stats.record(prefix_hit.num_queried_tokens, prefix_hit.num_tokens)
        return True

    def _release_left_window(self, state: _RequestBlocks, position: int) -> None:
        """Sliding groups: release the blocks no query at or after `position` can see."""
        for group, window in self._sliding_groups:
            first = (position - window + 1) // self.block_size  # _first_window_block, inlined
            skipped = state.num_skipped_blocks[group]
            if first <= skipped:
                continue
            table = state.tables[group]
            first = min(first, len(table))
            released = table[skipped:first]
            table[skipped:first] = [NULL_BLOCK_ID] * len(released)
            state.num_skipped_blocks[group] = first
            self.pool.free(released)

    # ---- after a step ----------------------------------------------------------------------

    def cache_computed_blocks(self, request: CacheRequest) -> None:
        """Make the request's full, computed blocks prefix-cache entries (call after each step)."""
        state = self._requests.get(request.request_id)
        if state is None or not self.enable_prefix_caching:
            return
        num_full = request.num_computed_tokens // self.block_size
        if num_full <= state.num_cached_blocks:
            return
        num_full = min(num_full, min(len(table) for table in state.tables))
        block_size, tokens, hashes = self.block_size, request.all_token_ids, request.block_hashes
        extend_block_hashes(hashes, tokens, num_full, block_size, request.cache_salt)
        pool = self.pool
        for block in range(state.num_cached_blocks, num_full):
            parent = hashes[block - 1] if block else salt_seed(request.cache_salt)
            block_tokens = tuple(tokens[block * block_size : (block + 1) * block_size])
            for group, table in enumerate(state.tables):
                block_id = table[block]
                if block_id != NULL_BLOCK_ID:
                    pool.cache_block(block_id, group, hashes[block], parent, block_tokens)
        state.num_cached_blocks = num_full

    def truncate(self, request_id: str, num_tokens: int) -> None:
        """Keep only the blocks holding positions < `num_tokens` (speculative rollback).

        `num_tokens` must not be below the request's computed tokens at its last scheduling:
        a sliding group may already have released blocks the window at that point could see."""
        state = self._requests[request_id]
        keep = _cdiv(num_tokens, self.block_size)
        for group, window in self._sliding_groups:
            if self._first_window_block(num_tokens, window) < state.num_skipped_blocks[group]:
                raise ValueError(
                    f"cannot roll {request_id} back to {num_tokens} tokens: its sliding-window "
                    "blocks before that point are already released"
                )
        for table in state.tables:
            if len(table) > keep:
                released = table[keep:]
                del table[keep:]
                released.reverse()
                self.pool.free(released)
        state.num_synced_blocks = min(state.num_synced_blocks, keep)
        state.num_cached_blocks = min(state.num_cached_blocks, keep)

    def free(self, request_id: str) -> None:
        """Release every block of the request (no-op for an unknown id)."""
        state = self._requests.pop(request_id, None)
        if state is None:
            return
        for table in state.tables:
            # Last block first: the tail of a prefix is the least useful cache entry.
            self.pool.free(reversed(table))

    def fork(self, parent_id: str, child_id: str, num_tokens: int) -> int:
        """Share the parent's blocks holding the first `num_tokens` tokens (rounded down to full
        blocks, which must be computed) with a new request `child_id`. Returns the number of
        shared tokens: the child's `num_computed_tokens`. Returns 0 and registers nothing when no
        block can be shared (the child then starts like any new request)."""
        if child_id in self._requests:
            raise ValueError(f"request {child_id} already holds blocks")
        parent = self._requests[parent_id]
        num_shared = min(num_tokens // self.block_size, min(len(t) for t in parent.tables))
        for group, window in self._sliding_groups:
            first = self._first_window_block(num_shared * self.block_size, window)
            if parent.num_skipped_blocks[group] > first:
                num_shared = 0  # the parent already released blocks the child would need
        if num_shared == 0:
            return 0
        child = _RequestBlocks([table[:num_shared] for table in parent.tables])
        child.num_cached_blocks = min(parent.num_cached_blocks, num_shared)
        child.num_skipped_blocks = [min(s, num_shared) for s in parent.num_skipped_blocks]
        for table in child.tables:
            self.pool.touch(table)
        self._requests[child_id] = child
        return num_shared * self.block_size

    # ---- what the runner needs -------------------------------------------------------------

    def take_new_block_ids(self, request_id: str) -> tuple[int, tuple[tuple[int, ...], ...]]:
        """The table index from which the runner's copy changes, and per group the entries from
        there to the end; marks them sent. A request seen for the first time gets whole tables."""
        state = self._requests[request_id]
        start = state.num_synced_blocks
        length = len(state.tables[0])
        if length == start:
            return start, self._empty_tables
        state.num_synced_blocks = length
        return start, tuple(tuple(table[start:]) for table in state.tables)


class _Lookup:
    """Looks up block j of one request in one group (hashes must already be extended)."""

    __slots__ = ("pool", "tokens", "hashes", "block_size", "seed")

    def __init__(self, pool: BlockPool, request: CacheRequest, block_size: int) -> None:
        self.pool = pool
        self.tokens = request.all_token_ids
        self.hashes = request.block_hashes
        self.block_size = block_size
        self.seed = salt_seed(request.cache_salt)

    def __call__(self, group: int, block: int) -> int | None:
        first = block * self.block_size
        block_tokens = tuple(self.tokens[first : first + self.block_size])
        parent = self.hashes[block - 1] if block else self.seed
        return self.pool.lookup(group, self.hashes[block], parent, block_tokens)
