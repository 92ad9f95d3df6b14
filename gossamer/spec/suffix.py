"""Suffix proposer: frequency counts of recent n-grams (SuffixDecoding's idea, simplified).

Two structures count every substring of length <= `max_depth` with how often it occurred:

- one per request, over its own prompt + output (`_RequestIndex`): a suffix array over the
  tokens known at the request's first proposal, built with numpy (~1 ms for a 4k-token prompt,
  where a trie of the prompt took ~100 ms), and a trie of the substrings whose last token
  arrived later, grown O(max_depth) per token. The two never count one occurrence twice, and a
  query adds their counts;
- one shared trie, over the outputs of the last `max_cached_requests` finished requests
  (agentic and templated workloads repeat whole passages across requests). Adding an output
  costs ~max_depth node operations per token, so outputs are added (and evicted) a bounded
  number of tokens per `propose` call: a batch that finishes at once does not stall one step.

To propose, take the longest suffix of the request's tokens that occurred before with at least
one continuation, then walk down greedily, always to the most frequent continuation (ties: the
one that occurred first). Each step multiplies a confidence by that continuation's share of all
continuations; the walk stops when the confidence drops below `min_token_prob`, or after
`max_spec_factor * match length` tokens (a short match earns a short draft), or
`num_speculative_tokens`. Both structures propose and the one with the larger expected number
of accepted tokens (the sum of the confidences) wins.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from gossamer.spec.proposer import BaseProposer, Draft, SpecRequest
from gossamer.spec.suffix_array import SuffixArray
from gossamer.spec.suffix_trie import Step, SuffixAppender, SuffixTrie

# Tokens of finished outputs the shared trie takes in per `propose` call, at least; a backlog
# larger than this many calls' worth is worked off faster (an eighth of it per call).
SHARED_TOKENS_PER_CALL = 64
SHARED_BACKLOG_CALLS = 8


class _Cursor:
    """A string x in a `_RequestIndex`: its occurrences inside the suffix array's tokens (the
    rows [lo, hi), whose column `depth` holds what followed), and the trie node of those that
    end later (None: none do)."""

    __slots__ = ("index", "depth", "lo", "hi", "node")

    def __init__(self, index: _RequestIndex, depth: int, lo: int, hi: int, node: int | None):
        self.index, self.depth, self.lo, self.hi, self.node = index, depth, lo, hi, node

    def best_child(self) -> tuple[int, int, int, _Cursor] | None:
        """The most frequent continuation over both parts; ties: the earliest occurrence."""
        array, trie = self.index.array, self.index.appender.trie
        counts: dict[int, int] = {}
        bounds: dict[int, tuple[int, int]] = {}
        if self.lo < self.hi:
            children = array.children(self.lo, self.hi, self.depth)
            bounds = dict(zip(children.tokens, children.bounds, strict=True))
            counts = dict(zip(children.tokens, children.counts, strict=True))
        later = [] if self.node is None else list(trie.children(self.node))[::-1]  # oldest first
        for token, child in later:
            if trie.counts[child]:
                counts[token] = counts.get(token, 0) + trie.counts[child]
        if not counts:
            return None
        best = max(counts.values())
        tied = [token for token, count in counts.items() if count == best]
        token = tied[0] if len(tied) == 1 else min(tied, key=self._first_occurrence(bounds, later))
        lo, hi = bounds.get(token, (0, 0))
        node = trie.child(self.node, token) if self.node is not None else None
        return token, best, sum(counts.values()), _Cursor(self.index, self.depth + 1, lo, hi, node)

    def _first_occurrence(self, bounds, later):
        """Sort key: where x + token first occurs. An occurrence inside the array comes before
        any later one; the trie's children, oldest first, are in the order they first occurred."""
        array = self.index.array
        order = {token: array.size + i for i, (token, _) in enumerate(later)}
        return lambda token: array.first_start(*bounds[token]) if token in bounds else order[token]


class _RequestIndex:
    """The substring counts of one request's tokens: a suffix array over the tokens known when
    it was built, and a trie of the substrings whose last token came after them. It tracks the
    request's current suffixes (lengths 1 .. depth - 1) in both: `ranges[m - 1]`, the array rows
    of the suffix of length m (only non-empty ones: a longer suffix of a missing one is missing
    too), and `appender.active[m - 1]`, its trie node."""

    __slots__ = ("array", "appender", "ranges", "num_added")

    def __init__(self, tokens: Sequence[int], depth: int) -> None:
        self.array = SuffixArray(np.fromiter(tokens, np.int64, len(tokens)), depth)
        self.appender = SuffixAppender(SuffixTrie(depth))
        self.ranges: list[tuple[int, int]] = []
        # NOTE: the trie starts with the (uncounted) nodes of the array's last tokens, so that
        # substrings that start inside the array and end later grow from the right nodes.
        for token in tokens[max(len(tokens) - (depth - 1), 0) :]:
            self._append(token, count=0)
        self.num_added = len(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Take in the tokens the request gained since the last call."""
        for token in tokens[self.num_added :]:
            self._append(token, count=1)
        self.num_added = len(tokens)

    def _append(self, token: int, count: int) -> None:
        self.appender.append(token, count)
        array = self.array
        lo, hi = array.narrow(0, array.size, 0, token)
        ranges = [(lo, hi)] if lo < hi else []
        for column, (lo, hi) in enumerate(self.ranges[: array.depth - 2] if ranges else (), 1):
            lo, hi = array.narrow(lo, hi, column, token)
            if lo == hi:
                break
            ranges.append((lo, hi))
        self.ranges = ranges

    def longest_match(self) -> _Cursor | None:
        """The longest current suffix that occurred before with a continuation."""
        active = self.appender.active
        trie = self.appender.trie
        for length in range(len(active), 0, -1):
            lo, hi = self.ranges[length - 1] if length <= len(self.ranges) else (0, 0)
            node = active[length - 1]
            if self.array.has_children(lo, hi, length) or trie.has_counted_child(node):
                return _Cursor(self, length, lo, hi, node)
        return None


class _RecentOutputs:
    """The shared trie over the outputs of the last `capacity` finished requests, with the
    queue of outputs still to add or evict (worked off in `catch_up`)."""

    def __init__(self, depth: int, capacity: int) -> None:
        self.trie = SuffixTrie(depth)
        self.capacity = capacity
        self.cached: deque[list[int]] = deque()
        # (output, appender while adding or None while removing, tokens done)
        self._queue: deque[tuple[list[int], SuffixAppender | None, int]] = deque()
        self.backlog = 0  # tokens queued

    def push(self, output: list[int]) -> None:
        if not output or self.capacity == 0:
            return
        self.cached.append(output)
        self._enqueue(output, SuffixAppender(self.trie))
        while len(self.cached) > self.capacity:
            self._enqueue(self.cached.popleft(), None)

    def _enqueue(self, output: list[int], appender: SuffixAppender | None) -> None:
        self._queue.append((output, appender, 0))
        self.backlog += len(output)

    def catch_up(self) -> None:
        """Add or evict a bounded number of queued tokens, in queue order."""
        budget = max(SHARED_TOKENS_PER_CALL, self.backlog // SHARED_BACKLOG_CALLS)
        while self._queue and budget > 0:
            output, appender, done = self._queue.popleft()
            end = min(done + budget, len(output))
            if appender is not None:
                for token in output[done:end]:
                    appender.append(token)
            else:
                self.trie.remove(output, done, end)
            budget -= end - done
            self.backlog -= end - done
            if end < len(output):
                self._queue.appendleft((output, appender, end))

    def longest_match(self, tokens: Sequence[int]) -> tuple[int, int] | None:
        """(length, node) of the longest suffix of `tokens` with a continuation."""
        trie = self.trie
        if trie.is_empty():
            return None
        for length in range(min(trie.max_depth - 1, len(tokens)), 0, -1):
            node = trie.find(tokens[len(tokens) - length :])
            if node is not None and trie.has_counted_child(node):
                return length, node
        return None


class SuffixProposer(BaseProposer):
    name = "suffix"

    def __init__(
        self,
        num_speculative_tokens: int,
        max_depth: int = 16,
        max_cached_requests: int = 256,
        max_spec_factor: float = 1.0,
        min_token_prob: float = 0.1,
    ) -> None:
        self.num_speculative_tokens = num_speculative_tokens
        self.max_depth = max_depth
        self.max_spec_factor = max_spec_factor
        self.min_token_prob = min_token_prob
        self.shared = _RecentOutputs(max_depth, max_cached_requests)
        self._requests: dict[str, _RequestIndex] = {}

    def propose(self, requests: Sequence[SpecRequest]) -> list[Draft | None]:
        self.shared.catch_up()
        return [self._propose_one(request) for request in requests]

    def _propose_one(self, request: SpecRequest) -> Draft | None:
        limit = min(self.num_speculative_tokens, request.max_draft_tokens)
        best: tuple[float, list[int]] = (0.0, [])
        own = self._request_index(request).longest_match()
        if own is not None:
            best = self._walk(_Cursor.best_child, own, own.depth, limit)
        shared = self.shared.longest_match(request.token_ids)
        if shared is not None:
            length, node = shared
            candidate = self._walk(self.shared.trie.best_child, node, length, limit)
            best = max(best, candidate, key=_score)
        return Draft(best[1]) if best[1] else None

    def _request_index(self, request: SpecRequest) -> _RequestIndex:
        index = self._requests.get(request.request_id)
        if index is None:
            index = self._requests[request.request_id] = _RequestIndex(
                request.token_ids, self.max_depth
            )
        index.extend(request.token_ids)
        return index

    def _walk(self, best_child, node, match_length: int, limit: int) -> tuple[float, list[int]]:
        """Greedy most-frequent path below `node` (`best_child(node)` steps down one, None at
        a leaf): (expected accepted tokens, tokens)."""
        max_tokens = min(
            limit,
            max(1, int(self.max_spec_factor * match_length)),
            self.max_depth - match_length,
        )
        confidence, score, out = 1.0, 0.0, []
        step: Step | None
        while len(out) < max_tokens and (step := best_child(node)) is not None:
            token, count, total, node = step
            confidence *= count / total
            if confidence < self.min_token_prob:
                break
            out.append(token)
            score += confidence
        return score, out

    def release(self, request_id: str, token_ids: Sequence[int], num_prompt_tokens: int) -> None:
        self._requests.pop(request_id, None)
        self.shared.push(list(token_ids[num_prompt_tokens:]))


def _score(candidate: tuple[float, list[int]]) -> float:
    return candidate[0]
