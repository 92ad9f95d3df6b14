"""A truncated suffix array: the substring counts of a fixed token sequence, built with numpy.

The suffix proposer needs, for a context x (a string of at most `depth` - 1 tokens), how often
each token followed x. A trie of every substring answers that, but building one in Python costs
`depth` node allocations per token (about 100 ms for a 4k-token prompt, ~1 s for 16k). Here the
sequence's suffixes are sorted by their first `depth` tokens instead (prefix doubling: log2(depth)
numpy sorts, ~0.5 ms for 4k tokens), and a trie node becomes a *range* of that order:

- the rows whose first m tokens equal x are contiguous: x's range [lo, hi), hi - lo its count;
- within it the rows are sorted by token m, so x's children are runs of column m, and narrowing
  to the child x + t is two binary searches in that column (`narrow`).

Positions past the end read as -1, which sorts first: a row whose column m is -1 is the
occurrence of x at the very end, which nothing follows (a trie counts it in x but in no child).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

PAST_END = -1
# Children found by binary search before the rest of a range goes to numpy: a step's cost then
# depends on how many continuations a context has, not on how often it occurred.
FEW_RUNS = 8


@dataclass(frozen=True)
class Children:
    """The children of a range: distinct next tokens (ascending), each child's [lo, hi)."""

    tokens: list[int]
    bounds: list[tuple[int, int]]

    @property
    def counts(self) -> list[int]:
        return [hi - lo for lo, hi in self.bounds]


class SuffixArray:
    """The suffixes of `tokens`, sorted by their first `depth` tokens."""

    def __init__(self, tokens: np.ndarray, depth: int) -> None:  # tokens: [length] ints >= 0
        self.depth = depth
        self.size = len(tokens)
        order = _sorted_starts(tokens, depth)
        padded = np.concatenate([tokens.astype(np.int32), np.full(depth, PAST_END, np.int32)])
        windows = sliding_window_view(padded, depth)[: self.size]  # [size, depth]
        # columns[m, i]: token m of the i-th sorted suffix; column-major so that a range of one
        # column is contiguous
        self.columns = np.ascontiguousarray(windows[order].T)  # [depth, size]
        self.starts = order  # [size]: where each sorted suffix starts in `tokens`

    def narrow(self, lo: int, hi: int, column: int, token: int) -> tuple[int, int]:
        """The sub-range of [lo, hi) whose token `column` is `token` (empty: lo == hi)."""
        # NOTE: bisect on the array beats np.searchsorted (~1 us against ~3 us per call here)
        values = self.columns[column]
        first = bisect.bisect_left(values, token, lo, hi)
        return first, bisect.bisect_right(values, token, first, hi)

    def has_children(self, lo: int, hi: int, column: int) -> bool:
        """Whether some occurrence in [lo, hi) is followed by a token (the last row sorts last)."""
        return lo < hi and column < self.depth and int(self.columns[column, hi - 1]) != PAST_END

    def children(self, lo: int, hi: int, column: int) -> Children:
        """The runs of column `column` in [lo, hi), without the occurrence at the end. The first
        few by binary search (a context inside repeated text has one or two continuations,
        however often it occurred); past FEW_RUNS the rest in one numpy pass."""
        values = self.columns[column]
        start = bisect.bisect_left(values, 0, lo, hi)  # PAST_END sorts first
        tokens: list[int] = []
        bounds: list[tuple[int, int]] = []
        while start < hi and len(tokens) < FEW_RUNS:
            token = int(values[start])
            end = bisect.bisect_right(values, token, start, hi)
            tokens.append(token)
            bounds.append((start, end))
            start = end
        if start < hi:
            rest = values[start:hi]
            edges = np.flatnonzero(rest[1:] != rest[:-1]) + 1
            firsts = np.concatenate([[0], edges])
            ends = np.concatenate([edges, [len(rest)]])
            tokens += rest[firsts].tolist()
            bounds += zip((firsts + start).tolist(), (ends + start).tolist(), strict=True)
        return Children(tokens, bounds)

    def first_start(self, lo: int, hi: int) -> int:
        """The earliest position of the occurrences in [lo, hi) (rows are not in position order)."""
        return int(self.starts[lo:hi].min())


def _sorted_starts(tokens: np.ndarray, depth: int) -> np.ndarray:
    """Start positions ordered by the tokens that follow them, compared over `depth` tokens
    (or more: the order then only refines), past the end lowest. Prefix doubling: rank[i] orders
    the `width` tokens from i; the ranks of i and i + width order the 2 * width tokens from i."""
    length = len(tokens)
    rank = tokens.astype(np.int64) + 1  # 0: past the end
    width = 1
    while width < depth:
        following = np.zeros(length, np.int64)
        following[: max(length - width, 0)] = rank[width:]
        pair = rank * (int(following.max(initial=0)) + 1) + following
        rank = np.unique(pair, return_inverse=True)[1].reshape(-1).astype(np.int64) + 1
        width *= 2
    return np.argsort(rank, kind="stable")
