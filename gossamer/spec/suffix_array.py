"""A growing, truncated suffix array: the substring counts of one request's tokens.

The suffix proposer needs, for a context x (a string of at most `depth` - 1 tokens), how often
each token followed x in the request, and where each x + token first occurred. Here every
suffix T[p:] is a row keyed by its first `depth` tokens as bytes, 4 big-endian bytes per token
(so that the bytes order is the token order), and the rows are sorted by key:

- the occurrences of x that start at p <= n - depth are the rows whose key starts with x's
  bytes: one contiguous range, two `bisect`s on a Python list of bytes (~0.2 us each, where
  numpy's searchsorted costs ~1.5 us a call), for a context of any length;
- within it the rows are sorted by the token after x, so x's children are runs of that range.

The last depth - 1 suffixes are shorter than `depth` (the fringe): they stay out of the list and
are searched in the encoded tokens directly (`bytes.find`). Each new token completes one of them,
which is inserted (a bisect and two list inserts: ~1 us at 1k rows, ~6 us at 16k). The rows of the
tokens known at the first proposal are sorted at once by numpy. A row, its 4 * depth bytes and a
start, is ~150 bytes; bytes and ints are invisible to the garbage collector.

Token ids must lie in [0, 2**32 - 1): 4 bytes of 0xff sort after any encoded token.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

TOKEN_BYTES = 4
AFTER_ANY_TOKEN = b"\xff" * TOKEN_BYTES
# Rows sorted as bytes below this many, by integer prefix doubling from it (bytes: ~20 us for 1k
# rows, but ~2.6 ms for 16k, where doubling takes ~0.7 ms)
SORT_BYTES_BELOW = 2048

# (next token, its count, the count of all next tokens, the context extended by it)
Child = tuple[int, int, int, "Context"]


class Context:
    """A string x (`key`: its encoded tokens) and its occurrences: the rows [lo, hi) and the
    starts of those in the fringe (ascending; each lies wholly within the tokens)."""

    __slots__ = ("key", "length", "lo", "hi", "fringe")

    def __init__(self, key: bytes, lo: int, hi: int, fringe: list[int]) -> None:
        self.key, self.length = key, len(key) // TOKEN_BYTES
        self.lo, self.hi, self.fringe = lo, hi, fringe


class SuffixArray:
    """The suffixes of a growing token sequence, sorted by their first `depth` tokens."""

    def __init__(self, tokens: Sequence[int], depth: int) -> None:
        self.depth = depth
        encoded = np.asarray(tokens, ">u4")
        self.encoded = bytearray(encoded.tobytes())
        self.size = len(tokens)
        self.keys, self.starts = _sorted_rows(encoded, depth)
        self._match = (0, depth - 1)  # (size, an upper bound on the longest match there)

    def extend(self, tokens: Sequence[int]) -> None:
        """Take in tokens[size:] (`tokens` is the sequence the array was built from, grown)."""
        width = TOKEN_BYTES * self.depth
        for token in tokens[self.size :]:
            self.encoded += token.to_bytes(TOKEN_BYTES, "big")
            self.size += 1
            start = self.size - self.depth  # the suffix the token completed
            if start >= 0:
                key = bytes(self.encoded[TOKEN_BYTES * start : TOKEN_BYTES * start + width])
                row = bisect_right(self.keys, key)
                self.keys.insert(row, key)
                self.starts.insert(row, start)

    # ---- reading -----------------------------------------------------------------------------

    def locate(self, key: bytes) -> Context:
        """The occurrences of the string with encoded tokens `key` (1 .. depth tokens)."""
        keys = self.keys
        lo = bisect_left(keys, key)
        hi = bisect_left(keys, key + AFTER_ANY_TOKEN, lo)
        return Context(key, lo, hi, self._fringe_occurrences(key))

    def _fringe_occurrences(self, key: bytes) -> list[int]:
        first = max(self.size - self.depth + 1, 0)
        found, offset = [], TOKEN_BYTES * first
        while (offset := self.encoded.find(key, offset)) >= 0:
            if offset % TOKEN_BYTES == 0:  # not a match across token boundaries
                found.append(offset // TOKEN_BYTES)
            offset += 1
        return found

    def longest_match(self) -> Context | None:
        """The longest suffix of the tokens (at most depth - 1) that occurred before with a
        continuation. NOTE: one found at size n bounds the next: a match of m at size n + g
        drops its last g tokens to one of at least m - g at n, so the usual case (the match
        grew with the tokens, or stayed at depth - 1) costs one probe, not a search."""
        size, bound = self._match
        longest = min(self.depth - 1, self.size - 1, bound + self.size - size)
        found = self._suffix_with_continuation(longest)
        if found is None:
            lo, hi = 0, longest - 1  # the answer lies in [lo, hi]; 0: none
            while lo < hi:
                middle = (lo + hi + 1) // 2
                context = self._suffix_with_continuation(middle)
                lo, hi = (middle, hi) if context is not None else (lo, middle - 1)
            found = self._suffix_with_continuation(lo)
        self._match = (self.size, 0 if found is None else found.length)
        return found

    def _suffix_with_continuation(self, length: int) -> Context | None:
        if length < 1:
            return None
        context = self.locate(bytes(self.encoded[TOKEN_BYTES * (self.size - length) :]))
        return context if self._continued(context) > 0 else None

    def _continued(self, context: Context) -> int:
        """How many occurrences of the context a token follows: every row (a row holds `depth`
        tokens, more than any context has) and the fringe's but one that ends the tokens."""
        count = context.hi - context.lo
        if context.fringe:
            last = self.size - 1 - context.length  # the latest start a token follows
            count += sum(start <= last for start in context.fringe)
        return count

    def best_child(self, context: Context, confidence: float, min_prob: float) -> Child | None:
        """The most frequent continuation (ties: the one that occurred first), or None when
        none has a count that keeps `confidence * count / total` at `min_prob` or above (the
        walk stops there anyway). NOTE: only the runs of at least that count matter, and every
        such run holds a row at lo, lo + step, lo + 2 step, ...: a context that occurred 1000
        times with 300 different continuations costs ~10 bisects at min_prob 0.1, not 300."""
        fringe = self._fringe_children(context) if context.fringe else {}
        total = context.hi - context.lo + sum(map(len, fringe.values()))
        need = _min_count(total, confidence, min_prob)
        if need > total:
            return None
        runs = self._sampled_runs(context, need)
        for token in fringe.keys() - runs.keys():
            runs[token] = self._run(context, token)
        best_count, tied = 0, []
        for token, (lo, hi) in runs.items():
            count = hi - lo + len(fringe.get(token, ()))
            if count > best_count:
                best_count, tied = count, [token]
            elif count == best_count:
                tied.append(token)
        if best_count < need:
            return None
        best = tied[0] if len(tied) == 1 else min(tied, key=lambda t: self._first(runs, fringe, t))
        lo, hi = runs[best]
        key = context.key + best.to_bytes(TOKEN_BYTES, "big")
        return best, best_count, total, Context(key, lo, hi, fringe.get(best, []))

    def _fringe_children(self, context: Context) -> dict[int, list[int]]:
        """token -> the fringe starts of the context's occurrences it follows."""
        found: dict[int, list[int]] = {}
        last = self.size - 1 - context.length
        for start in context.fringe:
            if start <= last:
                token = self._token(start + context.length)
                found.setdefault(token, []).append(start)
        return found

    def _sampled_runs(self, context: Context, step: int) -> dict[int, tuple[int, int]]:
        """token -> rows of each run that holds a row at lo + i * step."""
        keys, lo, hi = self.keys, context.lo, context.hi
        width = TOKEN_BYTES * (context.length + 1)
        runs: dict[int, tuple[int, int]] = {}
        row = lo
        while row < hi:
            prefix = keys[row][:width]
            first = bisect_left(keys, prefix, lo, row)
            end = bisect_left(keys, prefix + AFTER_ANY_TOKEN, row + 1, hi)
            runs[int.from_bytes(prefix[-TOKEN_BYTES:], "big")] = (first, end)
            row = max(end, row + step)
        return runs

    def _run(self, context: Context, token: int) -> tuple[int, int]:
        key = context.key + token.to_bytes(TOKEN_BYTES, "big")
        lo = bisect_left(self.keys, key, context.lo, context.hi)
        return lo, bisect_left(self.keys, key + AFTER_ANY_TOKEN, lo, context.hi)

    def _first(self, runs, fringe, token) -> int:
        """Where context + token first starts: rows start before any fringe occurrence."""
        lo, hi = runs[token]
        return min(self.starts[lo:hi]) if lo < hi else fringe[token][0]

    def _token(self, position: int) -> int:
        offset = TOKEN_BYTES * position
        return int.from_bytes(self.encoded[offset : offset + TOKEN_BYTES], "big")


def _min_count(total: int, confidence: float, min_prob: float) -> int:
    """The smallest count c with confidence * (c / total) >= min_prob, computed as the walk
    computes it (total + 1: no count does)."""
    if min_prob <= 0:
        return 1
    count = min(max(math.ceil(min_prob * total / confidence), 1), total + 1)
    while count > 1 and confidence * ((count - 1) / total) >= min_prob:
        count -= 1
    while count <= total and confidence * (count / total) < min_prob:
        count += 1
    return count


def _sorted_rows(tokens: np.ndarray, depth: int) -> tuple[list[bytes], list[int]]:
    """The keys of the complete rows (starts 0 .. n - depth), sorted, and their starts.
    `tokens`: big-endian uint32s."""
    width = TOKEN_BYTES * depth
    if len(tokens) < depth:
        return [], []
    windows = sliding_window_view(tokens.view(np.uint8), width)[::TOKEN_BYTES]  # [rows, width]
    rows = np.ascontiguousarray(windows)
    if len(rows) < SORT_BYTES_BELOW:
        # NOTE: numpy orders "S" items bytewise, as Python orders bytes
        order = np.argsort(rows.view(f"S{width}").ravel())  # equal keys: any order
    else:
        order = _sorted_starts(tokens.astype(np.uint64), depth)
        order = order[order < len(rows)]
    # "V" items turn into bytes without the trailing zeros that "S" items lose
    return rows[order].view(f"V{width}").ravel().tolist(), order.tolist()


def _sorted_starts(tokens: np.ndarray, depth: int) -> np.ndarray:
    """Start positions ordered by the tokens that follow them, compared over `depth` tokens or
    more (the order then only refines), past the end lowest. Prefix doubling: rank[i] orders the
    `width` tokens from i; the ranks of i, i + width, ... packed into one uint64 order the
    `per * width` tokens from i (integer sorts: ~4x faster than sorting bytes at 16k tokens)."""
    length = len(tokens)
    rank = tokens + 1  # 0: past the end
    width = 1
    while True:
        bits = max(int(rank.max(initial=0)).bit_length(), 1)
        per = 64 // bits
        key = np.zeros(length, np.uint64)
        for i in range(per):
            following = np.zeros(length, np.uint64)
            following[: max(length - i * width, 0)] = rank[i * width :]
            key = (key << np.uint64(bits)) | following
        width *= per
        order = np.argsort(key)
        if width >= depth:
            return order
        ordered = key[order]
        rank = np.empty(length, np.uint64)
        rank[order] = np.cumsum(np.concatenate(([1], ordered[1:] != ordered[:-1])), dtype=np.uint64)
