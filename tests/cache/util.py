"""A minimal request for driving the KV cache manager without the scheduler."""

from __future__ import annotations

from dataclasses import dataclass, field

from gossamer.cache import NULL_BLOCK_ID, KVCacheManager


@dataclass
class Req:
    request_id: str
    all_token_ids: list[int]
    num_computed_tokens: int = 0
    cache_salt: str | None = None
    block_hashes: list[int] = field(default_factory=list)


def admit(manager: KVCacheManager, request: Req, num_new_tokens: int | None = None) -> int:
    """Schedule a waiting request like the scheduler does; returns its cached tokens."""
    hit = manager.find_cached_prefix(request)
    if num_new_tokens is None:
        num_new_tokens = len(request.all_token_ids) - hit.num_tokens
    assert manager.allocate_slots(request, num_new_tokens, hit)
    request.num_computed_tokens = hit.num_tokens
    return hit.num_tokens


def run_step(manager: KVCacheManager, request: Req, num_new_tokens: int) -> None:
    """Pretend a step computed `num_new_tokens` tokens (which must be allocated)."""
    request.num_computed_tokens += num_new_tokens
    manager.cache_computed_blocks(request)


def check_refcounts(manager: KVCacheManager, request_ids: list[str]) -> None:
    """Every pool refcount equals the number of table entries naming that block."""
    counts = [0] * manager.pool.num_blocks
    for request_id in request_ids:
        for table in manager.block_tables(request_id):
            for block_id in table:
                if block_id != NULL_BLOCK_ID:
                    counts[block_id] += 1
    assert counts == manager.pool.ref_counts
    manager.pool.check_invariants()
