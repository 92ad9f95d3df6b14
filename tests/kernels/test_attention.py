"""Triton paged attention with sinks and sliding window, and the Triton KV write
(gossamer/kernels/attention.py), against the torch reference (gossamer/ops/torch_ref.py).

CPU tests run the kernels under the Triton interpreter on tiny shapes. Every cache slot that the
reference does not read (the null block 0, the tail of each sequence's last block) holds NaN, so a
kernel that reads one of them returns NaN. GPU tests (`-m gpu`) run the compiled kernels on
gpt-oss-120b shapes against the reference on the same GPU.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType

import pytest
import torch
import triton.language as tl

from gossamer.ops.base import FULL_GROUP, SLIDING_GROUP, AttentionMetadata
from gossamer.ops.torch_ref import TorchOps
from gossamer.spec.tree import TreeShape, ancestor_masks
from tests.kernels.interpreted import load_interpreted

_INTERPRETED = load_interpreted("attention")


@pytest.fixture
def kernels(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The interpreted kernels, with TRITON_INTERPRET=1 while the test launches them."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield _INTERPRETED


@dataclass
class Batch:
    q: torch.Tensor  # [T, Hq, D]
    kv_cache: torch.Tensor  # [2, num_blocks, block_size, Hkv, D]
    metadata: AttentionMetadata
    sinks: torch.Tensor  # [Hq] fp32
    group: int
    sliding_window: int | None
    scale: float


def make_batch(
    seqs: list[tuple[int, int]],  # (query_len, seq_len) per sequence
    *,
    num_q_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 16,
    block_size: int = 4,
    dtype: torch.dtype = torch.float32,
    sliding_window: int | None = None,
    sink_scale: float = 1.0,
    device: str = "cpu",
    seed: int = 0,
    null_before_window: bool = True,
    kv_dtype: torch.dtype | None = None,  # the cache's (fp8); None: dtype
) -> Batch:
    """A paged batch in shuffled physical blocks (never block 0). Blocks that left every query's
    window are the null block 0 in the table; block 0 and the unused tail of each sequence's last
    block hold NaN."""
    gen = torch.Generator(device=device).manual_seed(seed)
    blocks_needed = [math.ceil(seq_len / block_size) for _, seq_len in seqs]
    num_blocks = 2 + sum(blocks_needed)
    physical = torch.randperm(num_blocks - 1, generator=torch.Generator().manual_seed(seed)) + 1
    shape = (2, num_blocks, block_size, num_kv_heads, head_dim)
    kv_cache = torch.randn(shape, generator=gen, device=device).to(kv_dtype or dtype)
    kv_cache[:, 0] = float("nan")  # NOTE: the interpreter reads fp8's NaN as 480, as wrong
    block_table = torch.zeros(len(seqs), max(blocks_needed) + 1, dtype=torch.int32)
    used = 0
    for seq, (query_len, seq_len) in enumerate(seqs):
        table = physical[used : used + blocks_needed[seq]]
        used += blocks_needed[seq]
        block_table[seq, : len(table)] = table.to(torch.int32)
        tail = seq_len % block_size
        if tail:
            kv_cache[:, int(table[-1]), tail:] = float("nan")
        if sliding_window is not None and null_before_window:
            first_visible_key = max(0, seq_len - query_len - sliding_window + 1)
            block_table[seq, : first_visible_key // block_size] = 0
    query_lens = [query_len for query_len, _ in seqs]
    seq_lens = [seq_len for _, seq_len in seqs]
    starts = [0]
    for query_len in query_lens:
        starts.append(starts[-1] + query_len)
    block_table = block_table.to(device)
    metadata = AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        slot_mapping=(torch.empty(0, dtype=torch.int64),) * 2,
        block_tables=(block_table, block_table),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        query_lens_host=tuple(query_lens),
        seq_lens_host=tuple(seq_lens),
    )
    q = torch.randn((starts[-1], num_q_heads, head_dim), generator=gen, device=device).to(dtype)
    sinks = torch.randn(num_q_heads, generator=gen, device=device) * sink_scale
    group = FULL_GROUP if sliding_window is None else SLIDING_GROUP
    return Batch(q, kv_cache, metadata, sinks, group, sliding_window, head_dim**-0.5)


def reference(batch: Batch) -> torch.Tensor:
    return TorchOps().attention(
        batch.q,
        batch.kv_cache,
        batch.metadata,
        batch.group,
        batch.sinks,
        batch.scale,
        batch.sliding_window,
    )


def run_op(kernels: ModuleType, batch: Batch) -> torch.Tensor:
    """Through the op entry point, with the default launch heuristics."""
    return kernels.attention(
        batch.q,
        batch.kv_cache,
        batch.metadata,
        batch.group,
        batch.sinks,
        batch.scale,
        batch.sliding_window,
    )


def run_tuned(kernels: ModuleType, batch: Batch, **launch: int) -> torch.Tensor:
    """With forced launch knobs, to get several splits / tiles / key iterations on tiny shapes."""
    meta = batch.metadata
    return kernels.paged_attention(
        batch.q,
        batch.kv_cache,
        meta.query_start_loc,
        meta.seq_lens,
        meta.block_tables[batch.group],
        meta.max_query_len,
        meta.max_seq_len,
        batch.sinks,
        batch.scale,
        batch.sliding_window,
        tree_mask=meta.tree_mask,
        **launch,
    )


def assert_matches(actual: torch.Tensor, batch: Batch, atol: float = 2e-5, rtol: float = 1e-4):
    expected = reference(batch)
    assert not actual.isnan().any(), "the kernel read a slot it must not read (NaN) or divided by 0"
    torch.testing.assert_close(actual.float(), expected.float(), atol=atol, rtol=rtol)


DECODE_BATCHES = {
    "context_1": [(1, 1)],
    "context_not_block_multiple": [(1, 37)],
    "mixed_lengths": [(1, 1), (1, 5), (1, 37), (1, 64), (1, 17)],
}


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("seqs", DECODE_BATCHES.values(), ids=DECODE_BATCHES.keys())
def test_decode_matches_reference(kernels: ModuleType, seqs, block_size: int) -> None:
    batch = make_batch(seqs, block_size=block_size)
    assert_matches(run_op(kernels, batch), batch)
    # Three splits of 16-key iterations: several partials merged, some of them empty.
    assert_matches(run_tuned(kernels, batch, num_splits=3, block_n=16), batch)


@pytest.mark.parametrize("seq_len", [5, 8, 9, 30], ids=["short", "window", "window+1", "long"])
@pytest.mark.parametrize("num_splits", [1, 2])
def test_sliding_decode_never_reads_null_blocks(kernels: ModuleType, seq_len, num_splits) -> None:
    batch = make_batch([(1, seq_len), (1, 3)], sliding_window=8, block_size=4)
    if seq_len == 30:
        assert (batch.metadata.block_tables[SLIDING_GROUP][0, :5] == 0).all()  # null before window
    assert_matches(run_tuned(kernels, batch, num_splits=num_splits, block_n=16), batch)


def test_more_splits_than_keys(kernels: ModuleType) -> None:
    batch = make_batch([(1, 5), (1, 2)], block_size=4)
    assert_matches(run_tuned(kernels, batch, num_splits=8, block_n=16), batch)


@pytest.mark.parametrize("sliding_window", [None, 5])
@pytest.mark.parametrize("block_q", [2, None])
def test_prefill_prefix_hit_mid_block(kernels: ModuleType, sliding_window, block_q) -> None:
    # 13 cached tokens: the chunk starts mid-block (block_size 4).
    batch = make_batch([(11, 24)], sliding_window=sliding_window, block_size=4)
    assert_matches(run_tuned(kernels, batch, block_q=block_q, block_n=16), batch)


MIXED = [(1, 9), (7, 7), (1, 1), (12, 29), (3, 19)]


@pytest.mark.parametrize("sliding_window", [None, 6])
def test_mixed_batch_through_op(kernels: ModuleType, sliding_window) -> None:
    batch = make_batch(MIXED, sliding_window=sliding_window, block_size=4)
    assert batch.metadata.max_query_len > kernels.DECODE_MAX_QUERY_LEN  # the prefill launch
    assert_matches(run_op(kernels, batch), batch)
    assert_matches(run_tuned(kernels, batch, block_q=2, block_n=16), batch)


@pytest.mark.parametrize(
    "num_q_heads, num_kv_heads",
    [(4, 4), (4, 2), (4, 1), (6, 2)],
    ids=["gqa1", "gqa2", "gqa4", "gqa3"],
)
def test_gqa_ratios(kernels: ModuleType, num_q_heads: int, num_kv_heads: int) -> None:
    heads = dict(num_q_heads=num_q_heads, num_kv_heads=num_kv_heads)
    prefill = make_batch(MIXED, sliding_window=6, **heads)
    assert_matches(run_tuned(kernels, prefill, block_q=4, block_n=16), prefill)
    decode = make_batch([(1, 21), (1, 3)], **heads)
    assert_matches(run_tuned(kernels, decode, num_splits=2, block_n=16), decode)


@pytest.mark.parametrize("sliding_window", [None, 6])
def test_speculative_query_lengths_use_decode_launch(kernels: ModuleType, sliding_window) -> None:
    batch = make_batch([(3, 20), (1, 9), (4, 4), (8, 30)], sliding_window=sliding_window)
    assert batch.metadata.max_query_len <= kernels.DECODE_MAX_QUERY_LEN
    assert_matches(run_op(kernels, batch), batch)
    assert_matches(run_tuned(kernels, batch, num_splits=2, block_n=16), batch)


@pytest.mark.parametrize("sink_scale", [0.0, 30.0])
def test_sinks_tiny_and_dominant(kernels: ModuleType, sink_scale: float) -> None:
    # sink_scale 30: some sinks swamp every score, others vanish; both must stay finite and exact.
    batch = make_batch([(1, 11), (5, 14)], sink_scale=sink_scale)
    assert_matches(run_tuned(kernels, batch, num_splits=2, block_n=16), batch)
    assert_matches(run_tuned(kernels, batch, block_q=2, block_n=16), batch)


def test_fp16_head_dim_32_block_32(kernels: ModuleType) -> None:
    batch = make_batch(
        [(1, 40), (9, 45), (1, 3)],
        dtype=torch.float16,
        head_dim=32,
        block_size=32,
        sliding_window=7,
    )
    assert_matches(run_op(kernels, batch), batch, atol=3e-3, rtol=3e-3)
    decode = make_batch([(1, 70), (1, 33)], dtype=torch.float16, head_dim=32, block_size=32)
    assert_matches(
        run_tuned(kernels, decode, num_splits=2, block_n=16), decode, atol=3e-3, rtol=3e-3
    )


class LaunchSpy:
    """Stands in for a Triton kernel and counts its launches (`kernel[grid](...)`)."""

    def __init__(self, kernel) -> None:
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]


@pytest.fixture
def merge_spy(kernels: ModuleType, monkeypatch: pytest.MonkeyPatch) -> LaunchSpy:
    spy = LaunchSpy(kernels._merge_splits_kernel)
    monkeypatch.setattr(kernels, "_merge_splits_kernel", spy)
    return spy


# (seqs, options of make_batch, launch knobs): empty splits (more splits than iterations), mixed
# lengths, a sliding window past null blocks, dominant sinks, several query tiles per sequence.
IN_KERNEL_MERGES = {
    "empty_splits": ([(1, 5), (1, 2)], {}, dict(num_splits=8, block_n=16)),
    "eight_full_splits": ([(1, 128), (1, 7)], {}, dict(num_splits=8, block_n=16)),
    "mixed_lengths": ([(1, 1), (1, 37), (1, 17)], {}, dict(num_splits=3, block_n=16)),
    "sliding": ([(1, 30), (1, 3)], dict(sliding_window=8), dict(num_splits=2, block_n=16)),
    "dominant_sinks": ([(1, 11), (5, 14)], dict(sink_scale=30.0), dict(num_splits=2, block_n=16)),
    "query_tiles": (
        [(3, 20), (1, 9), (4, 4)],
        dict(sliding_window=6),
        dict(num_splits=3, block_n=16, block_q=2),
    ),
    # chunks of at least 32 keys: the 20-key and 1-key sequences finish in their one split (no
    # partials, no arrival), the 70-key one merges 3 of the 4 launched splits
    "min_split_keys": (
        [(1, 20), (1, 70), (1, 1)],
        {},
        dict(num_splits=4, block_n=16, min_split_keys=32),
    ),
    "min_split_keys_sliding": (
        [(1, 30), (1, 3)],
        dict(sliding_window=8),
        dict(num_splits=2, block_n=16, min_split_keys=64),
    ),
    "fp16": (
        [(1, 70), (1, 33)],
        dict(dtype=torch.float16, head_dim=32, block_size=32),
        dict(num_splits=4, block_n=16),
    ),
}


@pytest.mark.parametrize("case", IN_KERNEL_MERGES.values(), ids=IN_KERNEL_MERGES.keys())
def test_in_kernel_merge_matches_reference_and_merge_kernel(kernels, merge_spy, monkeypatch, case):
    seqs, options, launch = case
    batch = make_batch(seqs, **options)
    tol = dict(atol=3e-3, rtol=3e-3) if batch.q.dtype == torch.float16 else {}
    first = run_tuned(kernels, batch, **launch)
    assert merge_spy.launches == 0  # the attention kernel merged
    assert_matches(first, batch, **tol)
    assert not kernels._counters(batch.q.device).any()  # every tile reset its counter
    # Again (as a graph replay would): the counters start from zero, the same bits come out.
    assert torch.equal(run_tuned(kernels, batch, **launch), first)
    monkeypatch.setattr(kernels, "MERGE_IN_KERNEL", False)
    fallback = run_tuned(kernels, batch, **launch)
    assert merge_spy.launches == 1
    assert_matches(fallback, batch, **tol)
    torch.testing.assert_close(fallback, first, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("unroll", [True, False], ids=["unrolled", "loop"])
@pytest.mark.parametrize("case", ["eight_full_splits", "mixed_lengths"])
def test_in_kernel_merge_in_chunks(kernels, monkeypatch, case, unroll) -> None:
    """Two splits a chunk (rows x splits 32): 8 splits with keys in 4 chunks, 3 in 2 (a padding
    split in the second), through the unrolled chunks and through the loop."""
    seqs, options, launch = IN_KERNEL_MERGES[case]
    batch = make_batch(seqs, **options)
    whole = run_tuned(kernels, batch, **launch)
    monkeypatch.setattr(kernels, "MERGE_CHUNK", tl.constexpr(32))
    monkeypatch.setattr(kernels, "MERGE_UNROLL", tl.constexpr(2048 if unroll else 0))
    chunked = run_tuned(kernels, batch, **launch)
    assert_matches(chunked, batch)
    torch.testing.assert_close(chunked, whole, atol=1e-6, rtol=1e-6)


def test_every_tile_counts_its_splits_in_its_own_slot(kernels, monkeypatch) -> None:
    """The interpreter runs the query tiles and kv heads one after another, so shared counter slots
    would still merge right there: count the arrivals instead, with counters that never reach a
    merge. Every (query tile, kv head, seq) whose keys span several splits gets one arrival per
    split that holds keys (splits past the tile's keys exit without one) in its own slot; a tile
    whose keys fit one split finishes there, without an arrival."""
    batch = make_batch([(3, 40), (1, 9), (4, 4)])  # query tiles of 2: 2, 1 and 2 with rows
    device = batch.q.device
    start = -1000
    counters = torch.full((kernels.COUNTER_SLOTS,), start, dtype=torch.int32)
    monkeypatch.setitem(kernels._COUNTERS, device, counters)
    run_tuned(kernels, batch, num_splits=3, block_n=16, block_q=2)
    arrivals = counters - start
    num_kv_heads = batch.kv_cache.shape[3]
    # keys per tile: 39 and 40 (3 chunks of 16), 9 (1), 2 and 4 (1 each: no arrival)
    expected = [3] * 2 * num_kv_heads
    assert sorted(arrivals[arrivals != 0].tolist()) == expected


def test_merge_kernel_when_counter_slots_run_out(kernels, merge_spy, monkeypatch) -> None:
    batch = make_batch([(1, 21), (1, 3)])  # 2 kv heads x 2 seqs = 4 tiles
    monkeypatch.setattr(kernels, "COUNTER_SLOTS", 3)
    assert_matches(run_tuned(kernels, batch, num_splits=2, block_n=16), batch)
    assert merge_spy.launches == 1
    monkeypatch.setattr(kernels, "COUNTER_SLOTS", 4)
    assert_matches(run_tuned(kernels, batch, num_splits=2, block_n=16), batch)
    assert merge_spy.launches == 1


def test_one_split_launches_no_merge(kernels, merge_spy) -> None:
    batch = make_batch([(1, 21), (2, 3)])
    assert_matches(run_tuned(kernels, batch, num_splits=1, block_n=16), batch)
    assert merge_spy.launches == 0


def with_trees(batch: Batch, trees: dict[int, tuple[int, ...]]) -> Batch:
    """Mark sequences of the batch as tree steps: sequence s gets the ancestor masks of the tree
    whose parents are trees[s] (its query length must be 1 + the tree's nodes)."""
    meta = batch.metadata
    starts = meta.query_start_loc.tolist()
    masks = [0] * starts[-1]
    for seq, parents in trees.items():
        assert starts[seq + 1] - starts[seq] == 1 + len(parents)
        masks[starts[seq] : starts[seq + 1]] = ancestor_masks(parents, with_root=True)
    meta.tree_mask = torch.tensor(masks, dtype=torch.int64, device=meta.seq_lens.device)
    meta.tree_mask_host = tuple(masks)
    return batch


SMALL_TREE = (-1, -1, 0, 0, 2, 4, 5)  # 7 nodes, depth 5 (past a window of 3)
BIG_TREE = TreeShape.from_branching([3, 2, 1, 1]).parents[:15]  # 15 nodes, depth 4


@pytest.mark.parametrize("sliding_window", [None, 3, 8])
def test_tree_verification_in_the_decode_launch(kernels: ModuleType, sliding_window) -> None:
    """Trees of 8 tokens next to a decode and a chain verification: ancestors only, at their
    depths' positions (a window of 3 cuts the deepest nodes' ancestors)."""
    seqs = [(8, 20), (1, 9), (8, 8), (3, 33), (8, 13)]
    trees = {0: SMALL_TREE, 2: SMALL_TREE, 4: SMALL_TREE}
    batch = with_trees(make_batch(seqs, sliding_window=sliding_window), trees)
    assert batch.metadata.max_query_len <= kernels.DECODE_MAX_QUERY_LEN
    assert_matches(run_op(kernels, batch), batch)
    assert_matches(run_tuned(kernels, batch, num_splits=3, block_n=16), batch)


@pytest.mark.parametrize("sliding_window", [None, 3, 6])
@pytest.mark.parametrize("block_q", [2, None])
def test_tree_verification_in_the_prefill_launch(kernels: ModuleType, sliding_window, block_q):
    """A 16-token tree step beside a prompt chunk and a decode: the prefill launch, the tree cut
    into several query tiles (each later tile still sees the step's first positions)."""
    seqs = [(16, 40), (12, 29), (1, 5), (16, 16)]
    trees = {0: BIG_TREE, 3: BIG_TREE}
    batch = with_trees(make_batch(seqs, sliding_window=sliding_window, block_size=4), trees)
    assert batch.metadata.max_query_len > kernels.DECODE_MAX_QUERY_LEN
    assert_matches(run_tuned(kernels, batch, block_q=block_q, block_n=16), batch)


def test_tree_masks_change_the_output(kernels: ModuleType) -> None:
    """The tree test is a real one: the same batch read causally differs from the tree's."""
    batch = with_trees(make_batch([(8, 20)]), {0: SMALL_TREE})
    tree_out = run_op(kernels, batch)
    batch.metadata.tree_mask, batch.metadata.tree_mask_host = None, ()
    assert not torch.allclose(tree_out, run_op(kernels, batch), atol=1e-3)


def test_rejects_unsupported_head_dim(kernels: ModuleType) -> None:
    batch = make_batch([(1, 3)], head_dim=24)
    with pytest.raises(ValueError, match="head_dim"):
        run_op(kernels, batch)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_write_kv_matches_reference(kernels: ModuleType, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    num_tokens, num_kv_heads, head_dim, block_size = 6, 2, 16, 4
    # k and v as the model makes them: strided views into one qkv row.
    qkv = torch.randn(num_tokens, 3 * num_kv_heads * head_dim, generator=gen).to(dtype)
    k = qkv[:, num_kv_heads * head_dim : 2 * num_kv_heads * head_dim].view(
        -1, num_kv_heads, head_dim
    )
    v = qkv[:, 2 * num_kv_heads * head_dim :].view(-1, num_kv_heads, head_dim)
    slots = torch.tensor([5, -1, 0, 11, 22, -1], dtype=torch.int64)  # -1: padding, not stored
    cache = torch.randn(2, 6, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    expected = cache.clone()
    TorchOps().write_kv(k, v, expected, slots)
    kernels.write_kv(k, v, cache, slots)
    assert torch.equal(cache, expected)


FP8 = torch.float8_e4m3fn


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fp8_cache_is_read_in_the_query_dtype(kernels: ModuleType, dtype: torch.dtype) -> None:
    """An fp8 cache widens to q's dtype inside the kernel (fp8 values are exact in fp16 and fp32),
    so every launch shape matches the reference reading the same fp8 cache."""
    tol = dict(atol=3e-3, rtol=3e-3) if dtype == torch.float16 else {}
    decode = make_batch([(1, 37), (1, 5), (1, 64)], dtype=dtype, kv_dtype=FP8)
    assert decode.kv_cache.dtype == FP8
    assert_matches(run_op(kernels, decode), decode, **tol)
    assert_matches(run_tuned(kernels, decode, num_splits=3, block_n=16), decode, **tol)
    for window in (None, 6):
        mixed = make_batch(MIXED, sliding_window=window, dtype=dtype, kv_dtype=FP8)
        assert_matches(run_tuned(kernels, mixed, block_q=2, block_n=16), mixed, **tol)


def test_fp8_cache_changes_the_output_by_its_rounding_only(kernels: ModuleType) -> None:
    """The same batch over a float32 cache and over its fp8 copy: close (e4m3 keeps 3 mantissa
    bits) but not equal, so the fp8 launch really reads the rounded values."""
    exact = make_batch([(1, 40), (6, 30)], sliding_window=8)
    rounded = make_batch([(1, 40), (6, 30)], sliding_window=8, kv_dtype=FP8)
    same = rounded.kv_cache.float(), exact.kv_cache.to(FP8).float()
    torch.testing.assert_close(*same, atol=0, rtol=0, equal_nan=True)  # NaN: slots never read
    out_exact = run_op(kernels, exact)
    out_rounded = run_op(kernels, rounded)
    assert not torch.equal(out_exact, out_rounded)
    torch.testing.assert_close(out_rounded, out_exact, atol=0.1, rtol=0.1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_write_kv_into_fp8_cache(kernels: ModuleType, dtype: torch.dtype) -> None:
    """k and v stored into an fp8 cache as the reference stores them. The inputs are fp8 values
    (their conversion is exact): the interpreter rounds some fp8 conversions wrongly (1.95 -> 1.0,
    a mantissa carry it drops), so conversions that round are checked on the GPU."""
    gen = torch.Generator().manual_seed(2)
    k, v = (torch.randn(2, 6, 2, 16, generator=gen) * 4).to(FP8).to(dtype)
    slots = torch.tensor([5, -1, 0, 11, 22, -1], dtype=torch.int64)
    cache = torch.randn(2, 6, 4, 2, 16, generator=gen).to(FP8)
    expected = cache.clone()
    TorchOps().write_kv(k, v, expected, slots)
    kernels.write_kv(k, v, cache, slots)
    assert torch.equal(cache.view(torch.uint8), expected.view(torch.uint8))
    assert torch.equal(cache[1].flatten(0, 1)[22].float(), v[4].float())


def test_reference_write_saturates_fp8() -> None:
    """Out-of-range values land on +-448 (e4m3's largest), as the kernels' conversions do."""
    cache = torch.zeros(2, 1, 4, 1, 2, dtype=FP8)
    k = torch.tensor([[[1000.0, -1e6]], [[3.0, float("inf")]]])
    TorchOps().write_kv(k, -k, cache, torch.tensor([0, 1]))
    assert cache[0, 0, :2].flatten().float().tolist() == [448.0, -448.0, 3.0, 448.0]
    assert cache[1, 0, :2].flatten().float().tolist() == [-448.0, 448.0, -3.0, -448.0]


# ---------------------------------------------------------------- GPU: gpt-oss-120b shapes

GPU_SHAPES = dict(num_q_heads=64, num_kv_heads=8, head_dim=64, block_size=16, dtype=torch.bfloat16)


def _gpu_batch(
    seqs: list[tuple[int, int]], sliding_window: int | None, seed: int = 0, **options
) -> Batch:
    return make_batch(
        seqs, sliding_window=sliding_window, device="cuda", seed=seed, **GPU_SHAPES, **options
    )


def _random_decodes(batch_size: int, max_context: int, seed: int) -> list[tuple[int, int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, max_context + 1, (batch_size,), generator=gen).tolist()
    lengths[0] = max_context
    return [(1, length) for length in lengths]


def _assert_gpu_matches(actual: torch.Tensor, batch: Batch) -> None:
    assert_matches(actual, batch, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("sliding_window", [None, 128], ids=["full", "sliding"])
@pytest.mark.parametrize(
    "seqs",
    [[(1, 8192)], [(1, 1000)], _random_decodes(7, 8192, 1), _random_decodes(64, 8192, 2)],
    ids=["b1_8k", "b1_1k", "b7_mixed", "b64_mixed"],
)
def test_gpu_decode(seqs, sliding_window) -> None:
    from gossamer.kernels import attention as kernels

    batch = _gpu_batch(seqs, sliding_window)
    _assert_gpu_matches(run_op(kernels, batch), batch)


@pytest.mark.gpu
@pytest.mark.parametrize("sliding_window", [None, 128], ids=["full", "sliding"])
def test_gpu_mixed_prefill_and_decode(sliding_window) -> None:
    from gossamer.kernels import attention as kernels

    # A chunk after a mid-block prefix hit, a fresh prompt, decodes and a speculative verify.
    seqs = [(1000, 4003), (513, 513), (1, 8192), (1, 1), (4, 300), (1, 129)]
    batch = _gpu_batch(seqs, sliding_window)
    _assert_gpu_matches(run_op(kernels, batch), batch)


@pytest.mark.gpu
@pytest.mark.parametrize("sliding_window", [None, 128], ids=["full", "sliding"])
def test_gpu_speculative_verify(sliding_window) -> None:
    from gossamer.kernels import attention as kernels

    seqs = [(4, length) for length in (4, 130, 1000, 4097, 8192, 16, 17, 64)]
    batch = _gpu_batch(seqs, sliding_window)
    _assert_gpu_matches(run_op(kernels, batch), batch)


@pytest.mark.gpu
@pytest.mark.parametrize("sliding_window", [None, 128], ids=["full", "sliding"])
def test_gpu_tree_verification(sliding_window) -> None:
    """Tree steps (TREE launches) in the decode launch (8-token trees) and the prefill launch (a
    22-token tree: 21 nodes of branching [3, 2, 1, 1]) beside decodes and a prompt chunk."""
    from gossamer.kernels import attention as kernels

    big = TreeShape.from_branching([3, 2, 1, 1]).parents
    decode = [(8, length) for length in (8, 130, 1000, 8192)] + [(1, 4097)]
    batch = with_trees(_gpu_batch(decode, sliding_window), {0: SMALL_TREE, 2: SMALL_TREE})
    _assert_gpu_matches(run_op(kernels, batch), batch)
    prefill = [(22, 4097), (300, 813), (1, 129), (22, 22)]
    batch = with_trees(_gpu_batch(prefill, sliding_window), {0: big, 3: big})
    _assert_gpu_matches(run_op(kernels, batch), batch)


@pytest.mark.gpu
@pytest.mark.parametrize("sliding_window", [None, 128], ids=["full", "sliding"])
def test_gpu_decode_replays_in_cuda_graph_with_new_lengths(sliding_window) -> None:
    """Captured once, replayed at other lengths: the result follows the tensors, not the capture."""
    from gossamer.kernels import attention as kernels

    final_lens = [7000, 3, 4096, 640]
    capture_lens = [50, 1, 1000, 600]  # each fits the block tables made for final_lens
    # No null blocks: the captured lengths' windows lie before the final lengths' windows.
    seqs = [(1, length) for length in final_lens]
    batch = _gpu_batch(seqs, sliding_window, seed=3, null_before_window=False)
    meta = batch.metadata
    meta.max_seq_len = 8192  # what a runner captures with

    def set_lens(lens: list[int]) -> None:
        meta.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        meta.seq_lens_host = tuple(lens)

    set_lens(capture_lens)
    run_op(kernels, batch)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run_op(kernels, batch)
    graph.replay()
    torch.cuda.synchronize()
    _assert_gpu_matches(out, batch)
    set_lens(final_lens)
    graph.replay()
    torch.cuda.synchronize()
    _assert_gpu_matches(out, batch)


@pytest.mark.gpu
@pytest.mark.parametrize("sliding_window", [None, 128], ids=["full", "sliding"])
def test_gpu_in_kernel_merge_replays_in_cuda_graph(sliding_window, monkeypatch) -> None:
    """Split launches merged in the kernel, replayed many times: the counters start from zero at
    every replay, so each replay gives the same bits; the merge kernel path (MERGE_IN_KERNEL off, or
    a capture before any counter buffer exists) gives the same result."""
    from gossamer.kernels import attention as kernels

    spy = LaunchSpy(kernels._merge_splits_kernel)
    monkeypatch.setattr(kernels, "_merge_splits_kernel", spy)
    seqs = [(1, 8192), (2, 1000), (1, 37), (4, 4097)]  # query tiles of 4; 16 splits (2 sliding)
    batch = _gpu_batch(seqs, sliding_window, seed=4)
    batch.metadata.max_seq_len = 8192
    eager = run_op(kernels, batch)  # compiles outside the capture
    assert spy.launches == 0
    _assert_gpu_matches(eager, batch)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run_op(kernels, batch)
    for _ in range(5):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
    assert not kernels._counters(batch.q.device).any()

    monkeypatch.setattr(kernels, "MERGE_IN_KERNEL", False)
    fallback = run_op(kernels, batch)
    assert spy.launches == 1
    torch.testing.assert_close(fallback, eager, atol=1e-2, rtol=1e-2)
    monkeypatch.setattr(kernels, "MERGE_IN_KERNEL", True)
    monkeypatch.setattr(kernels, "_COUNTERS", {})  # no buffer yet: the capture cannot zero one
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run_op(kernels, batch)
    assert spy.launches == 2 and not kernels._COUNTERS
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, fallback)


@pytest.mark.gpu
def test_gpu_write_kv() -> None:
    from gossamer.kernels import attention as kernels

    gen = torch.Generator(device="cuda").manual_seed(0)
    cache = torch.randn(2, 64, 16, 8, 64, generator=gen, device="cuda").to(torch.bfloat16)
    k, v = torch.randn(2, 300, 8, 64, generator=gen, device="cuda").to(torch.bfloat16)
    slots = torch.randperm(64 * 16, device="cuda")[:300]
    slots[::7] = -1
    expected = cache.clone()
    TorchOps().write_kv(k, v, expected, slots)
    kernels.write_kv(k, v, cache, slots)
    assert torch.equal(cache, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("sliding_window", [None, 128], ids=["full", "sliding"])
def test_gpu_fp8_cache(sliding_window) -> None:
    from gossamer.kernels import attention as kernels

    decode = _gpu_batch(_random_decodes(64, 8192, 3), sliding_window, kv_dtype=FP8)
    _assert_gpu_matches(run_op(kernels, decode), decode)
    mixed = _gpu_batch([(1000, 4003), (1, 8192), (4, 300)], sliding_window, kv_dtype=FP8)
    _assert_gpu_matches(run_op(kernels, mixed), mixed)


@pytest.mark.gpu
def test_gpu_write_kv_into_fp8_cache() -> None:
    """bf16 -> e4m3 rounding and saturation: the kernel's bits are the reference's."""
    from gossamer.kernels import attention as kernels

    gen = torch.Generator(device="cuda").manual_seed(0)
    cache = torch.zeros(2, 64, 16, 8, 64, device="cuda", dtype=FP8)
    k, v = (torch.randn(2, 300, 8, 64, generator=gen, device="cuda") * 100).to(torch.bfloat16)
    k[0, 0, :4] = torch.tensor([1000.0, -1000.0, 447.0, 1.9453125])  # saturate; round up a binade
    slots = torch.randperm(64 * 16, device="cuda")[:300]
    slots[::7] = -1
    expected = cache.clone()
    TorchOps().write_kv(k, v, expected, slots)
    kernels.write_kv(k, v, cache, slots)
    assert torch.equal(cache.view(torch.uint8), expected.view(torch.uint8))


# (seqs, options of make_batch, tree parents per sequence, launch knobs): several 16-key
# iterations per split, a sliding window, and trees beside a chain verification.
PREFETCH_CASES = {
    "iterations": ([(1, 70), (1, 5), (1, 33)], {}, {}, dict(num_splits=2, block_n=16)),
    "one_split": ([(1, 90), (1, 17)], {}, {}, dict(num_splits=1, block_n=16)),
    "sliding": ([(1, 60), (1, 3)], dict(sliding_window=40), {}, dict(num_splits=1, block_n=16)),
    "trees": (
        [(8, 40), (1, 9), (3, 33)],
        dict(sliding_window=20),
        {0: SMALL_TREE},
        dict(num_splits=2, block_n=16),
    ),
}


@pytest.mark.parametrize("case", PREFETCH_CASES.values(), ids=PREFETCH_CASES.keys())
def test_prefetching_the_next_key_tile_changes_no_bit(kernels, monkeypatch, case) -> None:
    """PREFETCH_NEXT_KV loads each key tile an iteration early (the last prefetch is masked past
    the split): the same arithmetic in the same order, so the same bits."""
    seqs, options, trees, launch = case
    batch = with_trees(make_batch(seqs, **options), trees) if trees else make_batch(seqs, **options)
    monkeypatch.setattr(kernels, "PREFETCH_NEXT_KV", False)
    plain = run_tuned(kernels, batch, **launch)
    monkeypatch.setattr(kernels, "PREFETCH_NEXT_KV", True)
    prefetched = run_tuned(kernels, batch, **launch)
    assert torch.equal(prefetched, plain)
    assert_matches(prefetched, batch)


class GridSpy(LaunchSpy):
    """A LaunchSpy that keeps each launch's grid."""

    def __init__(self, kernel) -> None:
        super().__init__(kernel)
        self.grids = []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return super().__getitem__(grid)


def test_sliding_layers_split_their_window(kernels, monkeypatch) -> None:
    """A sliding-window decode launch splits its window into 64-key chunks (two for 100 keys,
    merged in the kernel); the output is the reference's, and full attention splits its 300 keys
    into more."""
    spy = GridSpy(kernels._paged_attention_kernel)
    monkeypatch.setattr(kernels, "_paged_attention_kernel", spy)
    seqs = [(1, 300), (1, 200)]
    sliding, full = make_batch(seqs, sliding_window=100), make_batch(seqs)
    assert_matches(run_tuned(kernels, sliding), sliding)
    assert_matches(run_tuned(kernels, full), full)
    (_, sliding_programs, _), (_, full_programs, _) = spy.grids
    num_kv_heads = sliding.kv_cache.shape[3]
    assert sliding_programs == num_kv_heads * 2  # 100 keys: 64-key splits
    assert full_programs > num_kv_heads * 2  # full attention over 300 keys: more splits
