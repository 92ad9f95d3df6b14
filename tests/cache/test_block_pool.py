"""Block pool invariants under random operation sequences (hypothesis state machine)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gossamer.cache.block_pool import NULL_BLOCK_ID, BlockPool, NoFreeBlocksError

NUM_BLOCKS = 9


class BlockPoolMachine(RuleBasedStateMachine):
    """Drives a pool against a model: `held` is the multiset of references callers hold,
    `content` what each cached block was registered with."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(NUM_BLOCKS)
        self.held: Counter[int] = Counter()
        # block -> (hash, parent hash, tokens) it was cached with
        self.content: dict[int, tuple[int, int, tuple[int, ...]]] = {}
        self.next_hash = 1

    @rule(count=st.integers(0, NUM_BLOCKS))
    def allocate(self, count: int) -> None:
        num_free = self.pool.num_free_blocks
        if count > num_free:
            with pytest.raises(NoFreeBlocksError):
                self.pool.allocate(count)
            return
        block_ids = self.pool.allocate(count)
        assert len(set(block_ids)) == count
        for block_id in block_ids:
            assert block_id != NULL_BLOCK_ID, "the null block was handed out"
            assert self.held[block_id] == 0, f"block {block_id} handed out while in use"
            self.held[block_id] += 1
            self.content.pop(block_id, None)  # allocation evicts whatever it cached
            assert not self.pool.is_cached(block_id)

    @precondition(lambda self: bool(+self.held))
    @rule(data=st.data())
    def free_one_reference(self, data: st.DataObject) -> None:
        block_id = data.draw(st.sampled_from(sorted(+self.held)))
        self.pool.free([block_id])
        self.held[block_id] -= 1

    @precondition(lambda self: bool(+self.held))
    @rule(data=st.data())
    def share(self, data: st.DataObject) -> None:
        """A fork: one more holder of a block in use."""
        block_id = data.draw(st.sampled_from(sorted(+self.held)))
        self.pool.touch([block_id])
        self.held[block_id] += 1

    @precondition(lambda self: bool(+self.held))
    @rule(data=st.data(), tokens=st.lists(st.integers(0, 3), min_size=1, max_size=3))
    def cache(self, data: st.DataObject, tokens: list[int]) -> None:
        block_id = data.draw(st.sampled_from(sorted(+self.held)))
        block_hash, self.next_hash = self.next_hash, self.next_hash + 1
        cached = self.pool.cache_block(block_id, 0, block_hash, block_hash - 1, tuple(tokens))
        assert cached == (block_id not in self.content)
        if cached:
            self.content[block_id] = (block_hash, block_hash - 1, tuple(tokens))

    @precondition(lambda self: bool(self.content))
    @rule(data=st.data(), confirm=st.booleans())
    def hit(self, data: st.DataObject, confirm: bool) -> None:
        """Look a cached block up; take it (a prefix-cache hit) only when confirmed."""
        block_id = data.draw(st.sampled_from(sorted(self.content)))
        block_hash, parent, tokens = self.content[block_id]
        if not confirm:
            # Same hash, other tokens: a collision must not be a hit.
            assert self.pool.lookup(0, block_hash, parent, tokens + (99,)) is None
            assert self.pool.lookup(0, block_hash, parent + 1000, tokens) is None
            return
        assert self.pool.lookup(0, block_hash, parent, tokens) == block_id
        self.pool.touch([block_id])
        self.held[block_id] += 1

    @rule()
    def reset_cache(self) -> None:
        self.pool.reset_prefix_cache()
        self.content.clear()

    @invariant()
    def consistent(self) -> None:
        pool = self.pool
        pool.check_invariants()
        free = set(pool.free_block_ids())
        for block_id in range(1, NUM_BLOCKS):
            assert pool.ref_counts[block_id] == self.held[block_id]
            assert (block_id in free) == (self.held[block_id] == 0), "free and in use at once"
        assert NULL_BLOCK_ID not in free
        assert {b for b in range(NUM_BLOCKS) if pool.is_cached(b)} == set(self.content)

    def teardown(self) -> None:
        # Every freed block is reusable: after dropping all references the whole pool allocates.
        for block_id, count in self.held.items():
            self.pool.free([block_id] * count)
        assert sorted(self.pool.allocate(NUM_BLOCKS - 1)) == list(range(1, NUM_BLOCKS))


BlockPoolMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
TestBlockPool = BlockPoolMachine.TestCase


def test_free_queue_order_uncached_first_then_least_recently_freed():
    pool = BlockPool(6)
    a, b, c, d, e = pool.allocate(5)
    pool.cache_block(a, 0, 1, 0, (1,))
    pool.cache_block(b, 0, 2, 1, (2,))
    pool.free([b, a, c])  # b then a go to the tail; uncached c jumps to the head
    assert pool.free_block_ids() == [c, b, a]
    pool.free([d])
    assert pool.free_block_ids() == [d, c, b, a]
    # A hit revives a cached free block; allocation then evicts the others' keys in order.
    pool.touch([a])
    assert pool.free_block_ids() == [d, c, b]
    assert pool.allocate(3) == [d, c, b]
    assert not pool.is_cached(b) and pool.is_cached(a)
    assert pool.stats.num_evicted_blocks == 1


def test_double_free_and_tiny_pool_are_errors():
    pool = BlockPool(3)
    (block_id,) = pool.allocate(1)
    pool.free([block_id])
    with pytest.raises(RuntimeError):
        pool.free([block_id])
    pool.free([NULL_BLOCK_ID])  # the null block is ignored, never counted
    assert pool.ref_counts[NULL_BLOCK_ID] == 0
    with pytest.raises(ValueError):
        BlockPool(1)


def test_duplicate_key_keeps_the_first_block():
    pool = BlockPool(4)
    first, second = pool.allocate(2)
    assert pool.cache_block(first, 0, 7, 0, (1, 2))
    assert not pool.cache_block(second, 0, 7, 0, (1, 2))
    assert pool.cache_block(second, 1, 7, 0, (1, 2))  # another group is another key
    assert pool.lookup(0, 7, 0, (1, 2)) == first
    assert pool.lookup(1, 7, 0, (1, 2)) == second
