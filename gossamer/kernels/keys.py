"""Packed int64 keys: a float32 value and an index in one integer whose order is (value, then the
lower index), so that one max finds the largest value and, among equal ones, the first index.

Used where a reduction across threads (or programs) picks a winner: the routing's top-k
(moe_mxfp4.TOP_K_KEYS: one max a slot instead of two reductions) and the greedy pick that the
unembedding GEMV makes across its programs with one atomic max each (model_runner.GREEDY_IN_GRAPH).
"""

from __future__ import annotations

import triton
import triton.language as tl

NO_KEY = tl.constexpr(-(2**63))  # below every key: nothing (or a taken slot)


@triton.jit
def order_bits(bits):
    """fp32 bits (int32) -> int32 in the floats' order (negative floats: magnitude bits flipped);
    its own inverse."""
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def value_key(values, index, INDEX_LIMIT: tl.constexpr):
    """key = ordered value bits << 32 | (INDEX_LIMIT - 1 - index), for 0 <= index < INDEX_LIMIT
    <= 2**32. -0.0 becomes +0.0 first, since a float comparison calls them equal (a tie: the
    lower index)."""
    values = tl.where(values == 0.0, 0.0, values)
    ordered = order_bits(values.to(tl.int32, bitcast=True))
    return (ordered.to(tl.int64) << 32) | (INDEX_LIMIT - 1 - index.to(tl.int64))


@triton.jit
def key_index(key, INDEX_LIMIT: tl.constexpr):
    """The index a key holds (int64)."""
    return INDEX_LIMIT - 1 - (key & 0xFFFFFFFF)


@triton.jit
def key_value(key):
    """The float32 value a key holds (-0.0 read back as +0.0)."""
    return order_bits((key >> 32).to(tl.int32)).to(tl.float32, bitcast=True)
