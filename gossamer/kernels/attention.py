"""Triton attention over the paged KV cache, with GPT-OSS's per-head learned sinks and sliding window,
and the KV-cache write.

One kernel, two launch shapes:

- decode (metadata.max_query_len <= DECODE_MAX_QUERY_LEN, so plain decode and speculative verify):
  flash-decoding. Grid (query tiles, kv heads x splits, seqs): the visible keys of a sequence are cut
  into `num_splits` contiguous chunks, each program runs an fp32 online softmax over its chunk and
  writes a partial (m, l, acc). The chunks are merged and the sink folded in by the last program of
  the tile to arrive, found with an atomic counter (MERGE: no second launch, like gemv.py's "last"
  split-K fix-up), or else by `_merge_splits_kernel`. With one split the attention kernel writes
  the final output itself.
- prefill (any larger max_query_len, so chunked prefill, prefix hits and mixed batches): the same
  kernel with bigger query tiles and one split.

Every program owns ONE kv head and packs all `Hq / Hkv` query heads of it (times the tile's query
tokens) into the rows of its tile, so each K/V element is loaded once per tile for the whole GQA
group. Row r of a tile is query token `tile_start + r // GROUP`, query head `kv_head * GROUP + r % GROUP`.

Keys are gathered one row at a time through the block table (key -> block_tables[key // block_size]),
so any block_size works and keys outside [first visible key, causal end) are never touched: in a
sliding group the blocks before the window may be the null block 0 and are never read.

Sinks: every split starts its running max at the sink logit (instead of -inf), which keeps all maxima
finite (no inf - inf) and is exactly the "max over scores AND the sink" of the definition; the sink's
own mass exp(sink - m) is added to the denominator once, at the end.

Tree speculation (`metadata.tree_mask`, TREE launches only): a sequence whose tokens carry
ancestor bitmasks sees the keys before its step plus the step's keys whose bit its row has, and
its rows and step keys sit at their tree positions first_pos + popcount - 1 for the sliding window
(key_begin then starts at the window of the step's first position, which the shallowest row
sees). Steps without a tree mask launch the kernel with TREE off: the code is compiled out.

Fused rotary embedding and KV write (`rope_write_kv_attention`, ROPE_KV launches: pure decode,
one query token per sequence, no tree): q, k, v come un-rotated, straight from the QKV projection,
and the separate rope + KV-write launch before attention (gossamer/kernels/rope.py) is saved. Each
program rotates its own query rows (rope.py's float32 arithmetic, rounded to q's dtype as rope.py's
output is). The new token's key is the last visible key, position seq_len - 1; of the programs of
one (sequence, kv head), exactly one has it in its split: that one rotates k, stores k and v at the
token's slot and passes a CTA barrier (which makes its stores visible to its own later loads) before
its key loop, which then reads the new key from the cache like any other. The other splits never
touch that key, so no program waits for another's write; the stored bits and so the output are the
ones the two launches give. With EARLY_KV each program loads its first key tile before its PDL
wait (overlapping the QKV projection's tail: -79 us per 120b step on the H200); a first tile that
holds the new key was loaded before the store, so that row is replaced by the stored bits in
registers. A negative slot (graph padding) stores nothing, as in rope.py, and its
row reads whatever its block table points at (the null block), as the two launches do.
NOTE: a write lands in the cache while other sequences of the batch read it, so, as with any batch
that the two launches would see, no sequence may read a slot that another writes in the same step.

Graph capture: nothing here reads tensor values on the host. The number of splits comes from host ints
(metadata.max_seq_len, max_query_len, the batch size); each program derives its chunk from the
sequence's real length on the device, so ANY seq_lens give correct results, whatever max_seq_len the
graph was captured with: a larger one only leaves trailing splits empty, a smaller one only gives
fewer, longer splits. NOTE: capture decode graphs with max_seq_len = the longest context they will
replay (e.g. max_model_len) to keep long contexts parallel.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from gossamer.kernels import gemv, pdl
from gossamer.ops.base import AttentionMetadata
from gossamer.ops.torch_ref import TorchOps

# Query lengths up to this use the decode launch (flash-decoding with key splits): q=1 decode and
# speculative verification of a few draft tokens.
DECODE_MAX_QUERY_LEN = 8
MAX_SPLITS = 64
# Decode launches split keys up to about this many programs per SM (latency hiding at batch 1), never
# past it: at batch 64 (512 programs of 8 kv heads) rounding the split count up gave 2 splits, and
# one was faster (H100, session 22, kernels_attention.py --sweep-batch: a full layer at 1k keys
# 57.2 -> 53.4 us, at 2k 101.5 -> 99.2, a sliding one 13.4 -> 10.5). With 132 SMs and 8 kv heads
# only batches 9, 17-21 and 34-65 get fewer splits than before (half).
PROGRAMS_PER_SM = 4
# ROPE_KV launches load their first key tile (block ids, K, V) before the PDL wait, so that its trip
# from HBM overlaps the QKV projection's tail (see the kernel's NOTE on why those reads are final).
# GOSSAMER_ATTN_EARLY_KV=0 for A/B runs.
EARLY_KV = os.environ.get("GOSSAMER_ATTN_EARLY_KV", "1") != "0"
# The early tile pays only after a launch that lets this one start before it ends: the QKV
# projection on the Triton GEMV (PDL), which serves up to gemv.max_rows("tall") rows (8). Past
# that cuBLAS projects QKV and lets nothing start early, so the early form's registers (207 a
# thread, 224 sliding, against 166: 2 programs an SM instead of 3) only cost. Measured on an H100
# (session 39, graph_timeline.py, 120b, batch 64 at 1k context, 512 programs): without the early
# tile a full layer took 55.5 us instead of 79.1, a sliding one 12.3 instead of 16.0, the fed
# step 24.69 ms instead of 25.09; at batch 1 and 8k context (also 512 programs, fusion_ab.py
# --fed) with it 2.571 ms a step against 2.605 without.
# Decode launches load each key tile one iteration ahead, so that a split's iterations overlap their
# trips to memory (the session-8 sweep measured ~1.2 us per 64-key iteration of one program: its
# block-table -> K/V loads are dependent and Triton's pipeliner does not overlap them). Measured on
# the H200 (session 9, benchmarks/fusion_ab.py, 120b batch 1, interleaved, tokens fed): 2.242 ->
# 2.207 ms per step at 1k context, 2.405 -> 2.381 at 8k; with 128-key splits instead of 64 it lost
# the gain (2.249 at 1k). GOSSAMER_ATTN_PREFETCH_NEXT=0 turns it off for A/B runs.
PREFETCH_NEXT_KV = os.environ.get("GOSSAMER_ATTN_PREFETCH_NEXT", "1") != "0"
# Keys per split at least (a multiple of DECODE_BLOCK_N). A split's partials, its arrival and the
# merge are about three dependent trips through L2, while one more key iteration in a program is
# one pipelined load: short contexts (a 128-key sliding window, 1k keys at batch 1) may be faster
# in fewer, longer splits. Applied on the device, from the real sequence length, so graphs captured
# at max_model_len follow it too; when only one split is left it writes the output itself.
# GOSSAMER_ATTN_MIN_SPLIT_KEYS for A/B runs (benchmarks/kernels_attention.py --min-split-keys).
DECODE_MIN_SPLIT_KEYS = int(os.environ.get("GOSSAMER_ATTN_MIN_SPLIT_KEYS", "64"))
# Sliding-window layers see at most window + query keys (129 at decode): with the split above they
# run as two splits and a merge. One split of the whole window was slower (H200, session 12:
# 120b batch 1 2.235 against 2.199 ms, 20b 1.571 against 1.555): the merge's trips through L2
# cost less than a program's extra key iteration.
# Split launches merge their partials in the attention kernel (the tile's last program) instead of
# a second launch (issue #8: the merge kernel cost 1.26 us per layer plus a launch gap on the H200).
# A switch for A/B measurements.
MERGE_IN_KERNEL = True
# rope_write_kv_attention fuses rotation and the KV write into pure-decode attention (benchmarks
# turn it off for an A/B of the two launches).
FUSE_ROPE_KV = True
# (query tile, kv head, seq) triples the in-kernel merge can count; a launch of more uses the kernel.
COUNTER_SLOTS = 16384
# Rows x splits of partials the in-kernel merge loads at once ([rows, splits, HEAD_DIM] fp32). Up to
# MERGE_UNROLL rows x splits in all its chunks are unrolled, so that their loads overlap; beyond, a
# loop (sm_90, triton 3.6: BLOCK_M 64 x 64 splits unrolled spills, smaller tiles use <= 230 regs).
# Unrolled chunks cover all SPLITS_P2 splits, masked past the used ones; the loop runs over the used
# ones only (a graph captured at 131k replaying 1k: 16 of 64). GOSSAMER_ATTN_MERGE_UNROLL: A/B runs.
MERGE_CHUNK = tl.constexpr(128)
MERGE_UNROLL = tl.constexpr(int(os.environ.get("GOSSAMER_ATTN_MERGE_UNROLL", "2048")))
DECODE_BLOCK_N = 64  # keys per loop iteration (64 keys x 64 dims x 2 bytes = 8 KB of K, 8 KB of V)
# Decode launches' warps and pipeline stages (benchmarks/kernels_attention.py --sweep-batch sets
# them for A/B runs).
DECODE_NUM_WARPS = 4
DECODE_NUM_STAGES = 3
PREFILL_BLOCK_N = 64
PREFILL_ROWS = 128  # query rows (tokens x GQA heads) per prefill tile
LOG2E = 1.4426950408889634


@triton.jit
def _popcount(bits):
    """Set bits of int64 values whose sign bit is clear (tree masks: at most 63 tokens)."""
    bits = bits - ((bits >> 1) & 0x5555555555555555)
    bits = (bits & 0x3333333333333333) + ((bits >> 2) & 0x3333333333333333)
    bits = (bits + (bits >> 4)) & 0x0F0F0F0F0F0F0F0F
    bits = bits + (bits >> 8)
    bits = bits + (bits >> 16)
    bits = bits + (bits >> 32)
    return bits & 0x7F


@triton.jit
def _paged_attention_kernel(
    q_ptr,  # [T, Hq, D]
    k_cache_ptr,  # [num_blocks, block_size, Hkv, D]
    v_cache_ptr,  # [num_blocks, block_size, Hkv, D]
    block_tables_ptr,  # [num_seqs, max_blocks] int32, any strides
    query_start_loc_ptr,  # [num_seqs + 1] int32
    seq_lens_ptr,  # [num_seqs] int32
    sinks_ptr,  # [Hq] fp32
    tree_mask_ptr,  # [T] int64 ancestor bitmasks, 0: causal (read when TREE)
    out_ptr,  # [T, Hq, D]: written when not SPLIT
    part_max_ptr,  # [T, Hq, num_splits] fp32: written when SPLIT (log2 units)
    part_sum_ptr,  # [T, Hq, num_splits] fp32
    part_acc_ptr,  # [T, Hq, num_splits, D] fp32
    counter_ptr,  # [COUNTER_SLOTS] int32 arrivals per (query tile, kv head, seq): read when MERGE
    k_new_ptr,  # [T, Hkv, D] this step's un-rotated keys (read when ROPE_KV, as are the next 4)
    v_new_ptr,  # [T, Hkv, D]
    positions_ptr,  # [T] int
    cos_sin_ptr,  # [max_pos, D] fp32: cos in [:, :D/2], sin in [:, D/2:]
    slot_mapping_ptr,  # [T] int64; < 0: not stored
    scale_log2,  # softmax scale * log2(e)
    window,  # sliding window (used when SLIDING)
    num_splits,
    min_chunk,  # keys per split at least, a multiple of BLOCK_N (DECODE_MIN_SPLIT_KEYS)
    num_q_heads,
    stride_q_tok,
    stride_q_head,
    stride_o_tok,
    stride_o_head,
    stride_c_block,
    stride_c_tok,
    stride_c_head,
    stride_bt_seq,
    stride_bt_block,  # the runner's tables are block-major (runner/step_buffers.py)
    stride_k_new_tok,
    stride_k_new_head,
    stride_v_new_tok,
    stride_v_new_head,
    stride_cos_sin,
    GROUP: tl.constexpr,  # Hq // Hkv
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    BLOCK_Q: tl.constexpr,  # query tokens per tile
    BLOCK_M: tl.constexpr,  # rows per tile: pow2 >= max(16, BLOCK_Q * GROUP)
    BLOCK_N: tl.constexpr,  # keys per iteration
    SLIDING: tl.constexpr,
    SPLIT: tl.constexpr,
    MERGE: tl.constexpr,  # SPLIT and the tile's last program merges the splits
    SPLITS_P2: tl.constexpr,  # next_power_of_2(num_splits) when MERGE, else 1
    TREE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    ROPE_KV: tl.constexpr,  # q is un-rotated; rotate it, and write the new key (see module doc)
    PDL: tl.constexpr,
    EARLY_KV: tl.constexpr = False,  # ROPE_KV only: the first key tile is loaded before the wait
    PREFETCH_NEXT: tl.constexpr = False,  # the key loop loads a tile ahead (PREFETCH_NEXT_KV)
):
    if not EARLY_KV:
        pdl.wait(PDL)
    # Later query tiles see more keys: start them first.
    q_tile = tl.num_programs(0) - 1 - tl.program_id(0)
    kv_head = tl.program_id(1) // num_splits
    split = tl.program_id(1) % num_splits
    seq = tl.program_id(2)

    q_begin = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_begin
    tile_start = q_tile * BLOCK_Q
    if tile_start >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    first_pos = seq_len - q_len  # position of the sequence's query token 0

    rows = tl.arange(0, BLOCK_M)
    row_token = tile_start + rows // GROUP  # query index inside the sequence
    row_head = kv_head * GROUP + rows % GROUP
    row_valid = (rows < BLOCK_Q * GROUP) & (row_token < q_len)
    row_pos = first_pos + row_token
    offs_d = tl.arange(0, HEAD_DIM)
    lowest_row = tile_start  # the step index of the tile's smallest position
    if TREE:
        seq_tree = tl.load(tree_mask_ptr + q_begin) != 0  # tree sequences mask every token
        row_bits = tl.load(tree_mask_ptr + q_begin + row_token, mask=row_valid, other=0)
        row_pos = tl.where(seq_tree, first_pos + _popcount(row_bits) - 1, row_pos)
        lowest_row = tl.where(seq_tree, 0, tile_start)

    # Keys this tile can see: [key_begin, key_end), cut into num_splits chunks of whole iterations.
    key_end = first_pos + tl.minimum(tile_start + BLOCK_Q, q_len)
    if SLIDING:
        key_begin = tl.maximum(first_pos + lowest_row - window + 1, 0)
    else:
        key_begin = 0
    chunk = tl.cdiv(tl.cdiv(key_end - key_begin, num_splits), BLOCK_N) * BLOCK_N
    chunk = tl.maximum(chunk, min_chunk)
    split_begin = key_begin + split * chunk
    split_end = tl.minimum(split_begin + chunk, key_end)
    # Splits past the keys (a graph captured for long contexts replays short ones: at 1k keys 48
    # of 64 splits are empty) neither store partials nor arrive; the merge counts the used ones.
    used_splits = tl.maximum(tl.cdiv(key_end - key_begin, tl.maximum(chunk, 1)), 1)  # 0 keys: 1
    if MERGE and split >= used_splits:
        return
    offs_n = tl.arange(0, BLOCK_N)
    block_table_row = block_tables_ptr + seq * stride_bt_seq
    cache_head_offset = kv_head * stride_c_head
    if EARLY_KV:
        # NOTE: before the wait. The metadata was uploaded before the step's first kernel, and
        # this layer's cache was last written by earlier steps, except the new token's slot,
        # which this launch writes below: its row of the tile is replaced in registers then.
        first_k, first_v = _kv_tile(k_cache_ptr, v_cache_ptr, block_table_row, stride_bt_block,
                                    split_begin, split_end, offs_n, offs_d, cache_head_offset,
                                    stride_c_block, stride_c_tok, BLOCK_SIZE)  # fmt: skip
        pdl.wait(PDL)

    q_ptrs = (
        q_ptr
        + (q_begin + row_token)[:, None] * stride_q_tok
        + row_head[:, None] * stride_q_head
        + offs_d[None, :]
    )
    if ROPE_KV:
        row_rope_pos = tl.load(positions_ptr + q_begin + row_token, mask=row_valid, other=0)
        q_table = cos_sin_ptr + row_rope_pos.to(tl.int64)[:, None] * stride_cos_sin
        q = _rotated(q_ptrs, q_table, row_valid[:, None], offs_d[None, :], HEAD_DIM // 2)
        q = q.to(q_ptr.dtype.element_ty)  # what rope.py stores, and attention loads
        if (split_begin <= first_pos) & (first_pos < split_end):  # this split holds the new key
            cache_head_offsets = kv_head * stride_c_head + offs_d  # [HEAD_DIM]
            new_k, new_v, stored = _write_new_kv(
                k_new_ptr, v_new_ptr, positions_ptr, cos_sin_ptr, slot_mapping_ptr, k_cache_ptr,
                v_cache_ptr, q_begin, kv_head, cache_head_offsets, stride_k_new_tok,
                stride_k_new_head, stride_v_new_tok, stride_v_new_head, stride_cos_sin,
                stride_c_block, stride_c_tok, HEAD_DIM, BLOCK_SIZE,
            )  # fmt: skip
            if EARLY_KV:  # the tile was loaded before the store: the stored bits, in registers
                is_new = (split_begin + offs_n == first_pos) & stored
                first_k = tl.where(is_new[:, None], new_k[None, :], first_k)
                first_v = tl.where(is_new[:, None], new_v[None, :], first_v)
        tl.debug_barrier()  # this program's cache stores above are visible to its loads below
    else:
        q = tl.load(q_ptrs, mask=row_valid[:, None], other=0.0)
    if not k_cache_ptr.dtype.element_ty.is_fp8():  # an fp8 cache is read in q's dtype
        q = q.to(k_cache_ptr.dtype.element_ty)
    sink = (
        tl.load(sinks_ptr + row_head, mask=row_valid, other=0.0).to(tl.float32) * 1.4426950408889634
    )

    row_max = sink  # [BLOCK_M] running max in log2 units; starts at the sink (see module doc)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    loop_begin = split_begin
    if EARLY_KV:  # (no tree, no sliding tree positions: ROPE_KV launches are plain decode)
        key_pos = split_begin + offs_n
        visible = (key_pos < split_end)[None, :] & (key_pos[None, :] <= row_pos[:, None])
        if SLIDING:
            visible = visible & (row_pos[:, None] - key_pos[None, :] < window)
        row_max, row_sum, acc = _attend_tile(q, first_k, first_v, visible, row_max, row_sum, acc,
                                             scale_log2, DOT_PRECISION)  # fmt: skip
        loop_begin = split_begin + BLOCK_N
    if PREFETCH_NEXT:  # tile i + 1's loads are issued before tile i's math (masked past the end)
        k, v = _kv_tile(k_cache_ptr, v_cache_ptr, block_table_row, stride_bt_block, loop_begin,
                        split_end, offs_n, offs_d, cache_head_offset, stride_c_block, stride_c_tok,
                        BLOCK_SIZE)  # fmt: skip
    for start_n in range(loop_begin, split_end, BLOCK_N):
        key_pos = start_n + offs_n
        key_in = key_pos < split_end
        if PREFETCH_NEXT:
            next_k, next_v = _kv_tile(k_cache_ptr, v_cache_ptr, block_table_row, stride_bt_block,
                                      start_n + BLOCK_N, split_end, offs_n, offs_d,
                                      cache_head_offset, stride_c_block, stride_c_tok,
                                      BLOCK_SIZE)  # fmt: skip
        else:
            k, v = _kv_tile(k_cache_ptr, v_cache_ptr, block_table_row, stride_bt_block, start_n,
                            split_end, offs_n, offs_d, cache_head_offset, stride_c_block,
                            stride_c_tok, BLOCK_SIZE)  # fmt: skip

        visible = key_in[None, :] & (key_pos[None, :] <= row_pos[:, None])
        key_tree_pos = key_pos
        if TREE:
            step_index = key_pos - first_pos  # < 0: a key before the step
            bit = tl.maximum(step_index, 0).to(tl.int64)
            ancestor = ((row_bits[:, None] >> bit[None, :]) & 1) != 0
            tree_visible = key_in[None, :] & (ancestor | (step_index < 0)[None, :])
            visible = tl.where(seq_tree, tree_visible, visible)
            if SLIDING:
                in_step = key_in & (step_index >= 0)
                key_bits = tl.load(tree_mask_ptr + q_begin + bit, mask=in_step, other=0)
                key_depth_pos = first_pos + _popcount(key_bits) - 1
                key_tree_pos = tl.where(seq_tree & in_step, key_depth_pos, key_pos)
        if SLIDING:
            visible = visible & (row_pos[:, None] - key_tree_pos[None, :] < window)
        row_max, row_sum, acc = _attend_tile(q, k, v, visible, row_max, row_sum, acc, scale_log2,
                                             DOT_PRECISION)  # fmt: skip
        if PREFETCH_NEXT:
            k, v = next_k, next_v

    token = q_begin + row_token
    out_ptrs = (
        out_ptr
        + token[:, None] * stride_o_tok
        + row_head[:, None] * stride_o_head
        + offs_d[None, :]
    )
    # With the in-kernel merge, a tile whose keys all fell into one split (a short context in a
    # launch sized for long ones) is finished here: no partials, no arrival, no merge.
    finish_here = not SPLIT  # a compile-time True or False, except with the merge
    if MERGE:
        finish_here = used_splits == 1
    if not finish_here:
        row_parts = (token * num_q_heads + row_head) * num_splits  # [BLOCK_M]: split 0's partial
        part = row_parts + split
        tl.store(part_max_ptr + part, row_max, mask=row_valid)
        tl.store(part_sum_ptr + part, row_sum, mask=row_valid)
        acc_ptrs = part_acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :]
        tl.store(acc_ptrs, acc, mask=row_valid[:, None])
        if MERGE:
            # NOTE: the barrier orders every thread's partial stores before the (release) arrival;
            # the program that sees all others arrived (acquire) merges the splits in order 0, 1, ..
            # so the result does not depend on which one came last (see gemv.py `_finish`).
            tl.debug_barrier()
            slot = (seq * (tl.num_programs(1) // num_splits) + kv_head) * tl.num_programs(0)
            slot += q_tile
            arrived = tl.atomic_add(counter_ptr + slot, 1, sem="acq_rel")
            if arrived == used_splits - 1:
                out = _merge_rows(part_max_ptr, part_sum_ptr, part_acc_ptr, row_parts, row_valid,
                                  sink, used_splits, BLOCK_M, HEAD_DIM, SPLITS_P2)  # fmt: skip
                tl.store(counter_ptr + slot, 0)  # ready for the next launch (graph replays too)
                tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None])
    else:
        denominator = row_sum + tl.exp2(sink - row_max)
        out = acc / denominator[:, None]
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None])


@triton.jit
def _kv_tile(k_cache_ptr, v_cache_ptr, block_table_row, stride_bt_block, start, end, offs_n,
             offs_d, cache_head_offset, stride_c_block, stride_c_tok,
             BLOCK_SIZE: tl.constexpr):  # fmt: skip
    """K and V [BLOCK_N, HEAD_DIM] of keys start + offs_n (zeros from `end` on), gathered through
    the sequence's block table."""
    key_pos = start + offs_n
    key_in = key_pos < end
    block_ptrs = block_table_row + (key_pos // BLOCK_SIZE) * stride_bt_block
    block = tl.load(block_ptrs, mask=key_in, other=0)
    key_offset = (
        block.to(tl.int64) * stride_c_block + (key_pos % BLOCK_SIZE) * stride_c_tok
        + cache_head_offset
    )  # fmt: skip
    kv_offsets = key_offset[:, None] + offs_d[None, :]  # [BLOCK_N, HEAD_DIM]
    k = tl.load(k_cache_ptr + kv_offsets, mask=key_in[:, None], other=0.0)
    v = tl.load(v_cache_ptr + kv_offsets, mask=key_in[:, None], other=0.0)
    return k, v


@triton.jit
def _attend_tile(q, k, v, visible, row_max, row_sum, acc, scale_log2, DOT_PRECISION: tl.constexpr):
    """One key tile of the online softmax: q [BLOCK_M, D] against k, v [BLOCK_N, D] where
    `visible` [BLOCK_M, BLOCK_N]; returns the running max (log2 units), sum and accumulator."""
    k = k.to(q.dtype)  # an fp8 cache's tiles widen here; otherwise a no-op
    v = v.to(q.dtype)
    scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
    scores = tl.where(visible, scores, float("-inf"))
    new_max = tl.maximum(row_max, tl.max(scores, axis=1))
    correction = tl.exp2(row_max - new_max)
    probs = tl.exp2(scores - new_max[:, None])
    row_sum = row_sum * correction + tl.sum(probs, axis=1)
    acc = acc * correction[:, None] + tl.dot(probs.to(v.dtype), v, input_precision=DOT_PRECISION)
    return new_max, row_sum, acc


@triton.jit
def _rotated(
    x_ptrs,  # [..., HEAD_DIM] element `dims` of each head
    table_ptrs,  # broadcastable to x_ptrs: cos_sin row of each head's position
    mask,
    dims,  # broadcastable to x_ptrs: the element's index in its head
    HALF: tl.constexpr,
):
    """The rotary embedding of whole heads, fp32: rope.py's x1 cos - x2 sin, x2 cos + x1 sin per
    element, with the element's partner loaded from the other half of its head."""
    first_half = dims < HALF
    frequency = tl.where(first_half, dims, dims - HALF)
    x = tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
    partner = tl.load(x_ptrs + tl.where(first_half, HALF, -HALF), mask=mask, other=0.0)
    partner = partner.to(tl.float32)
    cos = tl.load(table_ptrs + frequency, mask=mask, other=0.0).to(tl.float32)
    sin = tl.load(table_ptrs + HALF + frequency, mask=mask, other=0.0).to(tl.float32)
    return tl.where(first_half, x * cos - partner * sin, x * cos + partner * sin)


@triton.jit
def _write_new_kv(
    k_new_ptr,
    v_new_ptr,
    positions_ptr,
    cos_sin_ptr,
    slot_mapping_ptr,
    k_cache_ptr,
    v_cache_ptr,
    token,
    kv_head,
    cache_head_offsets,  # [HEAD_DIM] offsets of kv_head's elements inside a slot
    stride_k_new_tok,
    stride_k_new_head,
    stride_v_new_tok,
    stride_v_new_head,
    stride_cos_sin,
    stride_c_block,
    stride_c_tok,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """Store `token`'s key (rotated) and value of `kv_head` at its slot, as rope.py does. Returns
    them as stored ([HEAD_DIM] each, the cache's dtype) and whether they were (slot >= 0)."""
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    dims = tl.arange(0, HEAD_DIM)
    position = tl.load(positions_ptr + token).to(tl.int64)
    k_ptrs = k_new_ptr + token * stride_k_new_tok + kv_head * stride_k_new_head + dims
    k_table = cos_sin_ptr + position * stride_cos_sin
    k = _rotated(k_ptrs, k_table, dims < HEAD_DIM, dims, HEAD_DIM // 2)
    # rounded to k's dtype first, as rope.py's output is before the cache write (an fp8 cache)
    k = k.to(k_new_ptr.dtype.element_ty).to(k_cache_ptr.dtype.element_ty)
    v = tl.load(v_new_ptr + token * stride_v_new_tok + kv_head * stride_v_new_head + dims)
    v = v.to(v_cache_ptr.dtype.element_ty)
    stored = slot >= 0
    if stored:  # padding rows (slot < 0) store nothing
        slot_offset = (slot // BLOCK_SIZE) * stride_c_block + (slot % BLOCK_SIZE) * stride_c_tok
        tl.store(k_cache_ptr + slot_offset + cache_head_offsets, k)
        tl.store(v_cache_ptr + slot_offset + cache_head_offsets, v)
    return k, v, stored


@triton.jit
def _merge_rows(
    part_max_ptr,
    part_sum_ptr,
    part_acc_ptr,
    row_parts,  # [BLOCK_M] index of each row's split 0 in the partials
    row_valid,  # [BLOCK_M]
    sink,  # [BLOCK_M] log2 units
    num_splits,  # the splits that stored partials (the used ones, split 0 first)
    BLOCK_M: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    SPLITS_P2: tl.constexpr,
):
    """The output rows [BLOCK_M, HEAD_DIM] fp32 from all splits' partials: `_merge_splits_kernel`'s
    math for a tile's rows at once. Loads bypass L1 (.cg): other programs wrote the partials."""
    splits = tl.arange(0, SPLITS_P2)
    in_parts = row_valid[:, None] & (splits[None, :] < num_splits)  # padding splits: -inf, 0
    part_max = tl.load(part_max_ptr + row_parts[:, None] + splits[None, :], mask=in_parts,
                       other=float("-inf"), cache_modifier=".cg")  # fmt: skip
    # Every split started from the sink, so each part_max >= sink: the max is finite.
    total_max = tl.maximum(tl.max(part_max, axis=1), sink)  # [BLOCK_M]
    CHUNK: tl.constexpr = MERGE_CHUNK // BLOCK_M if SPLITS_P2 * BLOCK_M > MERGE_CHUNK else SPLITS_P2
    numerator = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    denominator = tl.zeros([BLOCK_M], dtype=tl.float32)
    if BLOCK_M * SPLITS_P2 <= MERGE_UNROLL:
        for first in tl.static_range(0, SPLITS_P2, CHUNK):  # unrolled: the chunks' loads overlap
            numerator, denominator = _merge_chunk(
                numerator, denominator, part_max_ptr, part_sum_ptr, part_acc_ptr, row_parts,
                row_valid, total_max, first, num_splits, HEAD_DIM, CHUNK)  # fmt: skip
    else:
        for first in range(0, num_splits, CHUNK):
            numerator, denominator = _merge_chunk(
                numerator, denominator, part_max_ptr, part_sum_ptr, part_acc_ptr, row_parts,
                row_valid, total_max, first, num_splits, HEAD_DIM, CHUNK)  # fmt: skip
    denominator += tl.exp2(sink - total_max)  # the sink's own mass, once
    return numerator / denominator[:, None]


@triton.jit
def _merge_chunk(
    numerator,  # [BLOCK_M, HEAD_DIM]
    denominator,  # [BLOCK_M]
    part_max_ptr,
    part_sum_ptr,
    part_acc_ptr,
    row_parts,
    row_valid,
    total_max,  # [BLOCK_M]
    first,  # the chunk's first split
    num_splits,
    HEAD_DIM: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """Adds splits [first, first + CHUNK) of every row, weighted by exp2(part_max - total_max)."""
    chunk = first + tl.arange(0, CHUNK)
    parts = row_parts[:, None] + chunk[None, :]  # [BLOCK_M, CHUNK]
    in_chunk = row_valid[:, None] & (chunk[None, :] < num_splits)
    chunk_max = tl.load(part_max_ptr + parts, mask=in_chunk, other=float("-inf"),
                        cache_modifier=".cg")  # fmt: skip
    chunk_sum = tl.load(part_sum_ptr + parts, mask=in_chunk, other=0.0, cache_modifier=".cg")
    acc_ptrs = part_acc_ptr + parts[:, :, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, None, :]
    chunk_acc = tl.load(acc_ptrs, mask=in_chunk[:, :, None], other=0.0, cache_modifier=".cg")
    weight = tl.exp2(chunk_max - total_max[:, None])  # [BLOCK_M, CHUNK]; 0 for padding splits
    numerator += tl.sum(chunk_acc * weight[:, :, None], axis=1)
    denominator += tl.sum(chunk_sum * weight, axis=1)
    return numerator, denominator


@triton.jit
def _merge_splits_kernel(
    part_max_ptr,  # [T, Hq, num_splits] fp32, log2 units
    part_sum_ptr,  # [T, Hq, num_splits] fp32
    part_acc_ptr,  # [T, Hq, num_splits, D] fp32
    sinks_ptr,  # [Hq] fp32
    out_ptr,  # [T, Hq, D]
    num_splits,
    num_q_heads,
    stride_o_tok,
    stride_o_head,
    HEAD_DIM: tl.constexpr,
    SPLITS_P2: tl.constexpr,
    PDL: tl.constexpr,
):
    token = tl.program_id(0)
    head = tl.program_id(1)
    pdl.wait(PDL)
    splits = tl.arange(0, SPLITS_P2)
    split_valid = splits < num_splits
    part = (token * num_q_heads + head) * num_splits + splits  # [SPLITS_P2]
    part_max = tl.load(part_max_ptr + part, mask=split_valid, other=float("-inf"))
    part_sum = tl.load(part_sum_ptr + part, mask=split_valid, other=0.0)
    offs_d = tl.arange(0, HEAD_DIM)
    acc_ptrs = part_acc_ptr + part[:, None] * HEAD_DIM + offs_d[None, :]
    part_acc = tl.load(acc_ptrs, mask=split_valid[:, None], other=0.0)  # [SPLITS_P2, D]

    sink = tl.load(sinks_ptr + head).to(tl.float32) * 1.4426950408889634
    # Every split started from the sink, so each part_max >= sink: the max is finite.
    total_max = tl.maximum(tl.max(part_max, axis=0), sink)
    weight = tl.exp2(part_max - total_max)  # [SPLITS_P2]; 0 for padding splits
    numerator = tl.sum(part_acc * weight[:, None], axis=0)  # [D]
    denominator = tl.sum(part_sum * weight, axis=0) + tl.exp2(sink - total_max)
    out = numerator / denominator
    out_ptrs = out_ptr + token * stride_o_tok + head * stride_o_head + offs_d
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty))


@triton.jit
def _write_kv_kernel(
    k_ptr,  # [T, Hkv, D]
    v_ptr,  # [T, Hkv, D]
    k_cache_ptr,  # [num_blocks, block_size, Hkv, D]
    v_cache_ptr,  # [num_blocks, block_size, Hkv, D]
    slot_mapping_ptr,  # [T] int64; < 0: skip
    num_kv_heads,
    stride_k_tok,
    stride_k_head,
    stride_v_tok,
    stride_v_head,
    stride_c_block,
    stride_c_tok,
    stride_c_head,
    HEAD_DIM: tl.constexpr,
    HEADS_P2: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    token = tl.program_id(0)
    heads = tl.arange(0, HEADS_P2)
    offs_d = tl.arange(0, HEAD_DIM)
    # The token's slot, broadcast to one copy per head (a [HEADS_P2] vector keeps masks 2-D).
    slot = tl.load(slot_mapping_ptr + token + heads * 0).to(tl.int64)
    head_valid = (heads < num_kv_heads)[:, None]
    store_mask = ((heads < num_kv_heads) & (slot >= 0))[:, None]
    k = tl.load(
        k_ptr + token * stride_k_tok + heads[:, None] * stride_k_head + offs_d[None, :],
        mask=head_valid,
        other=0.0,
    )
    v = tl.load(
        v_ptr + token * stride_v_tok + heads[:, None] * stride_v_head + offs_d[None, :],
        mask=head_valid,
        other=0.0,
    )
    # Clamp so that skipped tokens (slot < 0) compute an in-range address; their stores are masked.
    safe_slot = tl.maximum(slot, 0)
    cache_offsets = (
        ((safe_slot // BLOCK_SIZE) * stride_c_block)[:, None]
        + ((safe_slot % BLOCK_SIZE) * stride_c_tok)[:, None]
        + heads[:, None] * stride_c_head
        + offs_d[None, :]
    )
    tl.store(k_cache_ptr + cache_offsets, k.to(k_cache_ptr.dtype.element_ty), mask=store_mask)
    tl.store(v_cache_ptr + cache_offsets, v.to(v_cache_ptr.dtype.element_ty), mask=store_mask)


def attention(
    q: torch.Tensor,  # [T, Hq, D]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, Hkv, D]
    metadata: AttentionMetadata,
    group: int,
    sinks: torch.Tensor,  # [Hq] fp32
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """`Ops.attention` on Triton: causal attention over the paged cache with sinks -> [T, Hq, D]."""
    return _attend(q, kv_cache, metadata, group, sinks, scale, sliding_window, None)


def _attend(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    metadata: AttentionMetadata,
    group: int,
    sinks: torch.Tensor,
    scale: float,
    sliding_window: int | None,
    new_kv: NewKV | None,
) -> torch.Tensor:
    """paged_attention with its arguments taken from the op's metadata."""
    return paged_attention(
        q,
        kv_cache,
        metadata.query_start_loc,
        metadata.seq_lens,
        metadata.block_tables[group],
        metadata.max_query_len,
        metadata.max_seq_len,
        sinks,
        scale,
        sliding_window,
        tree_mask=metadata.tree_mask,
        new_kv=new_kv,
    )


@dataclass(frozen=True)
class NewKV:
    """A ROPE_KV launch's inputs beyond attention's: q is then un-rotated too (module doc)."""

    k: torch.Tensor  # [T, Hkv, D] un-rotated
    v: torch.Tensor  # [T, Hkv, D]
    positions: torch.Tensor  # [T] int
    cos_sin: torch.Tensor  # [max_pos, D] float32
    slot_mapping: torch.Tensor  # [T] int64, < 0: not stored


def fuses_rope_write_kv(q: torch.Tensor, metadata: AttentionMetadata) -> bool:
    """Whether `rope_write_kv_attention` takes this batch: pure decode, one query token per
    sequence, no tree. NOTE: it trusts the layout the runner builds (token s is sequence s's)."""
    return (
        FUSE_ROPE_KV
        and metadata.max_query_len == 1
        and metadata.tree_mask is None
        and q.shape[0] == metadata.num_seqs
    )


def rope_write_kv_attention(
    q: torch.Tensor,  # [T, Hq, D] un-rotated
    k: torch.Tensor,  # [T, Hkv, D] un-rotated
    v: torch.Tensor,  # [T, Hkv, D]
    positions: torch.Tensor,  # [T] int
    cos_sin: torch.Tensor,  # [max_pos, D] float32
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, Hkv, D]
    slot_mapping: torch.Tensor,  # [T] int64, < 0: not stored
    metadata: AttentionMetadata,
    group: int,
    sinks: torch.Tensor,  # [Hq] fp32
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """`Ops.rope_write_kv_attention` for a batch that `fuses_rope_write_kv` accepts: one launch of
    the decode kernel that also rotates q and k and stores k and v (module doc) -> [T, Hq, D]."""
    if not fuses_rope_write_kv(q, metadata):
        raise ValueError("rope_write_kv_attention: only pure decode batches (fuses_rope_write_kv)")
    new_kv = NewKV(k, v, positions, cos_sin, slot_mapping)
    return _attend(q, kv_cache, metadata, group, sinks, scale, sliding_window, new_kv)


def paged_attention(
    q: torch.Tensor,  # [T, Hq, D]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, Hkv, D]
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    seq_lens: torch.Tensor,  # [num_seqs] int32
    block_table: torch.Tensor,  # [num_seqs, max_blocks] int32
    max_query_len: int,
    max_seq_len: int,
    sinks: torch.Tensor,  # [Hq] fp32
    scale: float,
    sliding_window: int | None,
    *,
    tree_mask: torch.Tensor | None = None,  # [T] int64 (AttentionMetadata.tree_mask)
    num_splits: int | None = None,
    block_n: int | None = None,
    block_q: int | None = None,
    new_kv: NewKV | None = None,
    min_split_keys: int | None = None,
) -> torch.Tensor:
    """The attention op with explicit arguments. `num_splits`, `block_n`, `block_q` and
    `min_split_keys` (decode) override the launch heuristics (tests use them to force several
    splits, tiles and iterations on tiny shapes; benchmarks sweep them).
    With `new_kv` (one query token per sequence, no tree): q is un-rotated, and the kernel rotates
    it and writes the new keys and values first (a ROPE_KV launch, see the module doc).
    """
    num_tokens, num_q_heads, head_dim = q.shape
    _, _, block_size, num_kv_heads, cache_dim = kv_cache.shape
    _check_shapes(q, kv_cache, sinks, head_dim, cache_dim, num_q_heads, num_kv_heads)
    if new_kv is not None:
        _check_new_kv(new_kv, num_tokens, num_kv_heads, head_dim, max_query_len, tree_mask)
    group_size = num_q_heads // num_kv_heads
    num_seqs = seq_lens.shape[0]
    out = torch.empty((num_tokens, num_q_heads, head_dim), dtype=q.dtype, device=q.device)
    if num_tokens == 0 or num_seqs == 0:
        return out
    k_cache, v_cache = kv_cache[0], kv_cache[1]

    decode = max_query_len <= DECODE_MAX_QUERY_LEN
    if decode:
        block_q = block_q or triton.next_power_of_2(max(max_query_len, 1))
        block_n = block_n or DECODE_BLOCK_N
        if min_split_keys is None:  # forced splits (tests) keep chunks as short as block_n
            min_split_keys = DECODE_MIN_SPLIT_KEYS if num_splits is None else block_n
        min_chunk = triton.cdiv(max(min_split_keys, 1), block_n) * block_n
        if num_splits is None:
            visible = _max_visible_keys(max_seq_len, max_query_len, sliding_window)
            num_splits = _decode_splits(num_seqs, num_kv_heads, visible, min_chunk, q.device)
    else:
        block_q = block_q or max(1, PREFILL_ROWS // triton.next_power_of_2(group_size))
        block_n = block_n or PREFILL_BLOCK_N
        num_splits = num_splits or 1
        min_chunk = block_n
    block_m = max(16, triton.next_power_of_2(block_q * group_size))
    split = num_splits > 1
    if split:
        # NOTE: tokens of no sequence (padding) keep uninitialized partials, like the reference's
        # torch.empty_like output: their rows are garbage either way.
        part_max = torch.empty(
            (num_tokens, num_q_heads, num_splits), dtype=torch.float32, device=q.device
        )
        part_sum = torch.empty_like(part_max)
        part_acc = torch.empty(
            (num_tokens, num_q_heads, num_splits, head_dim), dtype=torch.float32, device=q.device
        )
    else:
        part_max = part_sum = part_acc = out  # unused when not SPLIT

    grid = (triton.cdiv(max(max_query_len, 1), block_q), num_kv_heads * num_splits, num_seqs)
    merge = split and _merge_in_kernel(grid[0] * num_kv_heads * num_seqs, q.device)
    _paged_attention_kernel[grid](
        q,
        k_cache,
        v_cache,
        block_table,
        query_start_loc,
        seq_lens,
        sinks,
        tree_mask if tree_mask is not None else seq_lens,  # not read without TREE
        out,
        part_max,
        part_sum,
        part_acc,
        _counters(q.device) if merge else seq_lens,  # not read without MERGE
        *_new_kv_arguments(new_kv, anchor=seq_lens),
        scale * LOG2E,
        sliding_window or 0,
        num_splits,
        min_chunk,
        num_q_heads,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_table.stride(0),
        block_table.stride(1),
        *_new_kv_strides(new_kv),
        GROUP=group_size,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_Q=block_q,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        SLIDING=sliding_window is not None,
        SPLIT=split,
        MERGE=merge,
        SPLITS_P2=triton.next_power_of_2(num_splits) if merge else 1,
        TREE=tree_mask is not None,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        ROPE_KV=new_kv is not None,
        EARLY_KV=new_kv is not None and _early_kv(num_tokens),
        PREFETCH_NEXT=PREFETCH_NEXT_KV and decode,
        num_warps=DECODE_NUM_WARPS if decode else 8,
        num_stages=DECODE_NUM_STAGES if decode else 2,
        **pdl.launch_options(q.device),
    )
    if split and not merge:
        _merge_splits_kernel[(num_tokens, num_q_heads)](
            part_max,
            part_sum,
            part_acc,
            sinks,
            out,
            num_splits,
            num_q_heads,
            out.stride(0),
            out.stride(1),
            HEAD_DIM=head_dim,
            SPLITS_P2=triton.next_power_of_2(num_splits),
            num_warps=1 if head_dim * num_splits <= 2048 else 4,
            **pdl.launch_options(q.device),
        )
    return out


def _new_kv_arguments(new_kv: NewKV | None, anchor: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """k, v, positions, cos_sin, slot_mapping for the kernel; `anchor` stands in for each when
    there is no new_kv (the kernel does not read them then)."""
    if new_kv is None:
        return (anchor,) * 5
    return new_kv.k, new_kv.v, new_kv.positions, new_kv.cos_sin, new_kv.slot_mapping


def _new_kv_strides(new_kv: NewKV | None) -> tuple[int, ...]:
    """Token and head strides of k and v, and the cos_sin row stride (zeros without new_kv)."""
    if new_kv is None:
        return (0,) * 5
    return (*new_kv.k.stride()[:2], *new_kv.v.stride()[:2], new_kv.cos_sin.stride(0))


def _check_new_kv(
    new_kv: NewKV,
    num_tokens: int,
    num_kv_heads: int,
    head_dim: int,
    max_query_len: int,
    tree_mask: torch.Tensor | None,
) -> None:
    if max_query_len != 1 or tree_mask is not None:
        raise ValueError("attention with new_kv needs one query token per sequence and no tree")
    expected = (num_tokens, num_kv_heads, head_dim)
    if new_kv.k.shape != expected or new_kv.v.shape != expected:
        raise ValueError(
            f"attention: new k {tuple(new_kv.k.shape)} / v {tuple(new_kv.v.shape)} must be "
            f"{list(expected)}"
        )
    _check_last_dim_contiguous(k=new_kv.k, v=new_kv.v, cos_sin=new_kv.cos_sin)


def _early_kv(num_tokens: int) -> bool:
    """Whether a ROPE_KV launch of `num_tokens` query tokens loads its first key tile before its
    PDL wait: where the QKV projection before it is a Triton GEMV launch (see EARLY_KV)."""
    return EARLY_KV and num_tokens <= gemv.max_rows("tall")


def _merge_in_kernel(tiles: int, device: torch.device) -> bool:
    """Whether a split launch of `tiles` (query tile, kv head, seq) triples merges in the kernel."""
    if not MERGE_IN_KERNEL or tiles > COUNTER_SLOTS:
        return False
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    # NOTE: zeroing a new counter buffer during capture would only be recorded, not done
    return not capturing or device in _COUNTERS


_COUNTERS: dict[torch.device, torch.Tensor] = {}


def _counters(device: torch.device) -> torch.Tensor:
    """[COUNTER_SLOTS] int32 arrivals per tile, zero between launches: a tile's merging program
    resets its slot. NOTE: shared by every launch on the device, so two split launches must not
    run at once on different streams."""
    if device not in _COUNTERS:
        _COUNTERS[device] = torch.zeros(COUNTER_SLOTS, dtype=torch.int32, device=device)
    return _COUNTERS[device]


def write_kv(
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,  # [T, Hkv, D]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, Hkv, D]
    slot_mapping: torch.Tensor,  # [T] int64; slots < 0 are skipped
) -> None:
    """`Ops.write_kv` on Triton: store k, v at slot_mapping (block_id * block_size + offset)."""
    num_tokens, num_kv_heads, head_dim = k.shape
    _, _, block_size, cache_heads, cache_dim = kv_cache.shape
    if (cache_heads, cache_dim) != (num_kv_heads, head_dim) or v.shape != k.shape:
        raise ValueError(
            f"write_kv: k {tuple(k.shape)} / v {tuple(v.shape)} do not match the cache heads "
            f"{cache_heads} x dim {cache_dim}"
        )
    if num_tokens == 0:
        return
    _check_last_dim_contiguous(k=k, v=v, kv_cache=kv_cache)
    _check_power_of_two_head_dim(head_dim)
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    _write_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        num_kv_heads,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        HEAD_DIM=head_dim,
        HEADS_P2=triton.next_power_of_2(num_kv_heads),
        BLOCK_SIZE=block_size,
        num_warps=4,
    )


def attention_reference(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    metadata: AttentionMetadata,
    group: int,
    sinks: torch.Tensor,
    scale: float,
    sliding_window: int | None,
) -> torch.Tensor:
    """The pure-torch twin (the oracle of the tests)."""
    return TorchOps().attention(q, kv_cache, metadata, group, sinks, scale, sliding_window)


def write_kv_reference(
    k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    TorchOps().write_kv(k, v, kv_cache, slot_mapping)


def _max_visible_keys(max_seq_len: int, max_query_len: int, sliding_window: int | None) -> int:
    """The most keys one query tile of a decode launch can see."""
    if sliding_window is None:
        return max(max_seq_len, 1)
    return max(min(max_seq_len, sliding_window + max_query_len - 1), 1)


def _decode_splits(
    num_seqs: int, num_kv_heads: int, visible_keys: int, min_chunk: int, device: torch.device
) -> int:
    """Splits for at most about PROGRAMS_PER_SM programs per SM, never more than chunks of
    min_chunk keys. A power of two (rounded down) so that few merge kernels get compiled."""
    programs = num_seqs * num_kv_heads
    wanted = PROGRAMS_PER_SM * _sm_count(device) // programs
    splits = min(wanted, triton.cdiv(visible_keys, min_chunk), MAX_SPLITS)
    return 1 << int(math.log2(max(splits, 1)))


def decode_context_bounds(
    num_seqs: int, query_len: int, num_kv_heads: int, max_seq_len: int, device: torch.device
) -> list[int]:
    """Context lengths below `max_seq_len` at which a step of `num_seqs` sequences of `query_len`
    tokens launches fewer key splits of full attention than at `max_seq_len`: for each smaller
    split count, the longest context that has it, ascending ([] past the decode launch's query
    lengths: one split). A graph captured with max_seq_len = such a bound launches, for every
    context from the bound before it, what an uncaptured step would (model_runner.CONTEXT_GRAPHS);
    one captured at `max_seq_len` launches that length's splits for every context, most of them
    empty at short ones (see `paged_attention`'s merge)."""
    if query_len > DECODE_MAX_QUERY_LEN:
        return []
    min_chunk = triton.cdiv(max(DECODE_MIN_SPLIT_KEYS, 1), DECODE_BLOCK_N) * DECODE_BLOCK_N
    full = _decode_splits(num_seqs, num_kv_heads, max_seq_len, min_chunk, device)
    longest: dict[int, int] = {}
    # the split count changes only where cdiv(keys, min_chunk) does: after a multiple of it
    for keys in range(min_chunk, max_seq_len, min_chunk):
        splits = _decode_splits(num_seqs, num_kv_heads, keys, min_chunk, device)
        if splits < full:
            longest[splits] = keys
    return sorted(longest.values())


@functools.cache
def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the interpreter on CPU: any small number


def _check_shapes(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    sinks: torch.Tensor,
    head_dim: int,
    cache_dim: int,
    num_q_heads: int,
    num_kv_heads: int,
) -> None:
    if head_dim != cache_dim:
        raise ValueError(f"attention: q head_dim {head_dim} != cache head_dim {cache_dim}")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"attention: {num_q_heads} q heads are not a multiple of {num_kv_heads}")
    if sinks.shape != (num_q_heads,):
        raise ValueError(f"attention: sinks {tuple(sinks.shape)} must be [{num_q_heads}]")
    _check_power_of_two_head_dim(head_dim)
    _check_last_dim_contiguous(q=q, kv_cache=kv_cache)


def _check_power_of_two_head_dim(head_dim: int) -> None:
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"Triton attention needs a power-of-two head_dim >= 16, got {head_dim}")


def _check_last_dim_contiguous(**tensors: torch.Tensor) -> None:
    for name, tensor in tensors.items():
        if tensor.stride(-1) != 1:
            raise ValueError(
                f"{name} must be contiguous in its last dim (stride {tensor.stride()})"
            )
