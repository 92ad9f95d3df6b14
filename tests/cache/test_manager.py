"""KV cache manager: prefix-cache hits, sliding-window release, fork, rollback."""

from __future__ import annotations

import math

import pytest

from gossamer.cache import NULL_BLOCK_ID, KVCacheLayout, KVCacheManager
from tests.cache.util import Req, admit, check_refcounts, run_step

BLOCK = 4


def full_only(num_blocks: int = 64, **kwargs) -> KVCacheManager:
    layout = KVCacheLayout.from_layer_windows([None, None])
    return KVCacheManager.from_layout(layout, num_blocks, block_size=BLOCK, **kwargs)


def hybrid(num_blocks: int = 64, window: int = 8, block_size: int = BLOCK) -> KVCacheManager:
    layout = KVCacheLayout.from_layer_windows([window, None, window, None])
    return KVCacheManager.from_layout(layout, num_blocks, block_size=block_size)


def computed(manager: KVCacheManager, request_id: str, tokens: list[int], **kwargs) -> Req:
    """A request whose whole prompt was computed in one step."""
    request = Req(request_id, list(tokens), **kwargs)
    admit(manager, request)
    run_step(manager, request, len(tokens) - request.num_computed_tokens)
    return request


def test_prefix_hits_share_blocks_and_count_tokens():
    manager = full_only()
    first = computed(manager, "a", list(range(40)))
    assert manager.prefix_cache_stats.num_hit_tokens == 0
    second = Req("b", list(range(40)))
    # 40 tokens are 10 full blocks, but the last token must be computed: 9 blocks hit.
    assert admit(manager, second) == 36
    (table_a,), (table_b,) = manager.block_tables("a"), manager.block_tables("b")
    assert table_b[:9] == table_a[:9] and table_b[9] != table_a[9]
    assert all(manager.pool.ref_counts[b] == 2 for b in table_a[:9])
    third = Req("c", list(range(22)) + [99] * 10)  # diverges inside block 5
    assert admit(manager, third) == 20
    stats = manager.prefix_cache_stats
    assert (stats.num_requests, stats.num_hit_requests) == (3, 2)
    assert (stats.num_queried_tokens, stats.num_hit_tokens) == (40 + 40 + 32, 36 + 20)
    check_refcounts(manager, ["a", "b", "c"])
    del first


def test_one_token_past_a_block_boundary_hits_the_whole_blocks():
    manager = full_only()
    computed(manager, "a", list(range(40)))
    assert admit(manager, Req("b", list(range(41)))) == 40


def test_salt_separates_and_confirmation_rejects_hash_collisions():
    manager = full_only()
    owner = computed(manager, "a", list(range(40)), cache_salt="alice")
    assert admit(manager, Req("b", list(range(40)), cache_salt="bob")) == 0
    assert admit(manager, Req("c", list(range(40)), cache_salt="alice")) == 36
    # Other tokens that claim the owner's hashes: the stored token ids must refuse the hit.
    forged = Req("d", [t + 1 for t in range(40)], cache_salt="alice")
    forged.block_hashes = list(owner.block_hashes)
    assert admit(manager, forged) == 0


def test_freed_blocks_stay_cached_until_evicted():
    manager = full_only(num_blocks=12)  # 11 usable blocks
    first = computed(manager, "a", list(range(40)))
    manager.free(first.request_id)
    assert manager.num_free_blocks == 11 and manager.pool.num_cached_blocks == 10
    assert admit(manager, Req("b", list(range(40)))) == 36
    manager.free("b")
    # A request needing every block evicts the cached ones.
    admit(manager, Req("filler", [7] * 44))
    manager.free("filler")
    assert admit(manager, Req("c", list(range(40)))) == 0
    assert manager.prefix_cache_stats.num_evicted_blocks >= 10


def test_no_caching_means_no_hits():
    manager = full_only(enable_prefix_caching=False)
    computed(manager, "a", list(range(40)))
    assert admit(manager, Req("b", list(range(40)))) == 0
    assert manager.pool.num_cached_blocks == 0


def test_sliding_prefix_hit_needs_only_the_window():
    manager = hybrid(window=8)
    computed(manager, "a", list(range(40)))
    later = Req("b", list(range(44)))
    assert admit(manager, later) == 40
    full, sliding = manager.block_tables("b")
    # The first new token (position 40) sees keys 33..40: blocks 8 and 9 of the prefix.
    first_window_block = (40 - 8 + 1) // BLOCK
    assert sliding[:first_window_block] == [NULL_BLOCK_ID] * first_window_block
    assert NULL_BLOCK_ID not in sliding[first_window_block:] and NULL_BLOCK_ID not in full
    check_refcounts(manager, ["a", "b"])


def test_sliding_group_limits_the_hit_when_window_blocks_are_gone():
    manager = hybrid(window=8)
    computed(manager, "a", list(range(40)))
    full_a, sliding_a = manager.block_tables("a")
    # Simulate eviction of single cache entries (white box: no public API drops one entry).
    manager.pool._uncache(sliding_a[9])
    assert admit(manager, Req("b", list(range(44)))) == 36  # window of 36 needs blocks 7, 8
    manager.pool._uncache(full_a[3])
    assert admit(manager, Req("c", list(range(44)))) == 12  # full group stops at block 3
    sliding_c = manager.block_tables("c")[1]
    assert sliding_c[:2] == [NULL_BLOCK_ID, sliding_a[1]]  # window of 12 sees keys 5..12
    check_refcounts(manager, ["a", "b", "c"])


@pytest.mark.parametrize(("window", "block_size"), [(8, 4), (7, 4), (128, 16), (5, 1)])
def test_sliding_blocks_stay_bounded_while_decoding(window: int, block_size: int):
    manager = hybrid(num_blocks=400, window=window, block_size=block_size)
    request = Req("a", list(range(10)))
    admit(manager, request)
    run_step(manager, request, 10)
    bound = math.ceil(window / block_size) + 1
    for position in range(10, 5 * window + 40):
        request.all_token_ids.append(position)
        assert manager.allocate_slots(request, 1)
        full, sliding = manager.block_tables("a")
        held = [b for b in sliding if b != NULL_BLOCK_ID]
        assert len(held) <= bound
        assert len(full) == position // block_size + 1 and NULL_BLOCK_ID not in full
        # Every key the query at `position` sees has a block; everything older is released.
        first_visible = max(0, position - window + 1) // block_size
        assert NULL_BLOCK_ID not in sliding[first_visible:]
        assert sliding[:first_visible] == [NULL_BLOCK_ID] * first_visible
        run_step(manager, request, 1)
    check_refcounts(manager, ["a"])
    manager.free("a")
    assert manager.num_free_blocks == 399


def test_model_without_sliding_layers_has_one_group():
    manager = full_only()
    assert manager.num_groups == 1
    admit(manager, Req("a", list(range(30))))
    assert manager.num_free_blocks == 63 - math.ceil(30 / BLOCK)


def test_fork_shares_full_computed_blocks():
    manager = hybrid(window=8)
    parent = computed(manager, "p", list(range(22)))
    shared = manager.fork("p", "c", 21)
    assert shared == 20
    child = Req("c", list(range(22)), num_computed_tokens=shared)
    assert manager.allocate_slots(child, 2)
    (full_p, sliding_p), (full_c, sliding_c) = manager.block_tables("p"), manager.block_tables("c")
    assert full_c[:5] == full_p[:5] and full_c[5] != full_p[5]
    # The child's first new token (position 20) sees keys 13..20: shared blocks 3 and 4.
    assert sliding_c[:5] == [NULL_BLOCK_ID] * 3 + sliding_p[3:5] and sliding_c[5] != sliding_p[5]
    check_refcounts(manager, ["p", "c"])
    manager.free(parent.request_id)
    check_refcounts(manager, ["c"])


def test_fork_refuses_when_the_parent_released_the_needed_window():
    manager = hybrid(window=8)
    parent = computed(manager, "p", list(range(30)))
    parent.all_token_ids.append(30)
    assert manager.allocate_slots(parent, 1)  # releases the blocks before the window of 30
    assert manager.fork("p", "c", 9) == 0
    assert not manager.has_request("c")
    assert manager.fork("p", "d", 28) == 28


def test_truncate_releases_blocks_and_resends_from_the_cut():
    manager = hybrid(window=8)
    request = Req("a", list(range(10)))
    admit(manager, request)
    manager.take_new_block_ids("a")
    run_step(manager, request, 10)
    free_before = manager.num_free_blocks
    request.all_token_ids.append(10)
    assert manager.allocate_slots(request, 9)  # one token + 8 drafts: positions 10..18
    start, new_ids = manager.take_new_block_ids("a")
    assert start == 3 and [len(ids) for ids in new_ids] == [2, 2]
    manager.truncate("a", 12)  # accepted one draft: positions 10, 11 are kept
    assert [len(t) for t in manager.block_tables("a")] == [3, 3]
    assert manager.num_free_blocks == free_before
    request.num_computed_tokens = 12
    assert manager.allocate_slots(request, 1)
    assert manager.take_new_block_ids("a")[0] == 3
    with pytest.raises(ValueError, match="already released"):
        for _ in range(20):
            request.num_computed_tokens += 1
            assert manager.allocate_slots(request, 1)
        manager.truncate("a", 2)


def test_num_blocks_needed_covers_chunked_prefill_peak():
    manager = hybrid(window=8)
    assert manager.num_blocks_needed(100, max_chunk_tokens=4) == 25 + math.ceil(11 / 4) + 1
    assert manager.num_blocks_needed(6, max_chunk_tokens=4) == 2 + 2
