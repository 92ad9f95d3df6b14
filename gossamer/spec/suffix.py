"""Suffix proposer: frequency-counted tries over recent n-grams (SuffixDecoding's idea, simplified).

Two tries hold every substring of length <= `max_depth` with how often it occurred:

- one per request, over its own prompt + output (appended incrementally, O(max_depth) per token);
- one shared, over the outputs of the last `max_cached_requests` finished requests (agentic and
  templated workloads repeat whole passages across requests).

To propose, take the longest suffix of the request's tokens that the trie holds with at least one
continuation, then walk down greedily, always to the most frequent child. Each step multiplies a
confidence by that child's share of its siblings' counts; the walk stops when the confidence drops
below `min_token_prob`, or after `max_spec_factor * match length` tokens (a short match earns a short
draft), or `num_speculative_tokens`. Both tries propose and the one with the larger expected number
of accepted tokens (the sum of the confidences) wins.

A per-request trie costs up to `max_depth` nodes per token; the shared one is bounded by the cached
requests' output lengths.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from gossamer.spec.proposer import BaseProposer, Draft, SpecRequest


class _Node:
    __slots__ = ("count", "children")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, _Node] = {}


class SuffixTrie:
    """Counts of the substrings (length <= max_depth) of the sequences added to it."""

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.root = _Node()

    def add(self, tokens: Sequence[int]) -> None:
        """Count every substring of `tokens` (a whole sequence)."""
        appender = SuffixAppender(self)
        for token in tokens:
            appender.append(token)

    def remove(self, tokens: Sequence[int]) -> None:
        """Undo `add(tokens)`; nodes whose count drops to zero are deleted."""
        for start in range(len(tokens)):
            self._decrement(tokens[start : start + self.max_depth])

    def _decrement(self, path: Sequence[int]) -> None:
        node = self.root
        for token in path:
            child = node.children[token]
            child.count -= 1
            if child.count == 0:
                del node.children[token]
                return  # the rest of the path hung below this node only
            node = child

    def find(self, context: Sequence[int]) -> _Node | None:
        node = self.root
        for token in context:
            node = node.children.get(token)
            if node is None:
                return None
        return node


class SuffixAppender:
    """Adds one growing sequence to a trie token by token: it keeps the nodes of the sequence's
    current suffixes of length 1 .. max_depth - 1 (`active[m - 1]` is the suffix of length m)."""

    __slots__ = ("trie", "active")

    def __init__(self, trie: SuffixTrie) -> None:
        self.trie = trie
        self.active: list[_Node] = []

    def append(self, token: int) -> None:
        extended = [_child(self.trie.root, token)]
        extended.extend(_child(node, token) for node in self.active)
        del extended[self.trie.max_depth - 1 :]  # suffixes at full depth cannot grow
        self.active = extended


def _child(node: _Node, token: int) -> _Node:
    child = node.children.get(token)
    if child is None:
        child = node.children[token] = _Node()
    child.count += 1
    return child


class _RequestTrie:
    __slots__ = ("trie", "appender", "num_added")

    def __init__(self, max_depth: int) -> None:
        self.trie = SuffixTrie(max_depth)
        self.appender = SuffixAppender(self.trie)
        self.num_added = 0


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
        self.max_cached_requests = max_cached_requests
        self.shared = SuffixTrie(max_depth)
        self._cached_outputs: deque[list[int]] = deque()
        self._requests: dict[str, _RequestTrie] = {}

    def propose(self, requests: Sequence[SpecRequest]) -> list[Draft | None]:
        return [self._propose_one(request) for request in requests]

    def _propose_one(self, request: SpecRequest) -> Draft | None:
        own = self._request_trie(request)
        limit = min(self.num_speculative_tokens, request.max_draft_tokens)
        tokens = request.token_ids
        best: tuple[float, list[int]] = (0.0, [])
        # own trie: the appender's active nodes are exactly the current suffixes' nodes
        for length in range(len(own.appender.active), 0, -1):
            node = own.appender.active[length - 1]
            if node.children:
                best = max(best, self._walk(node, length, limit), key=_score)
                break
        best = max(best, self._shared_candidate(tokens, limit), key=_score)
        return Draft(best[1]) if best[1] else None

    def _request_trie(self, request: SpecRequest) -> _RequestTrie:
        state = self._requests.get(request.request_id)
        if state is None:
            state = self._requests[request.request_id] = _RequestTrie(self.max_depth)
        tokens = request.token_ids
        for token in tokens[state.num_added :]:
            state.appender.append(token)
        state.num_added = len(tokens)
        return state

    def _shared_candidate(self, tokens: Sequence[int], limit: int) -> tuple[float, list[int]]:
        if not self.shared.root.children:
            return (0.0, [])
        for length in range(min(self.max_depth - 1, len(tokens)), 0, -1):
            node = self.shared.find(tokens[len(tokens) - length :])
            if node is not None and node.children:
                return self._walk(node, length, limit)
        return (0.0, [])

    def _walk(self, node: _Node, match_length: int, limit: int) -> tuple[float, list[int]]:
        """Greedy most-frequent path below `node`: (expected accepted tokens, tokens)."""
        max_tokens = min(
            limit,
            max(1, int(self.max_spec_factor * match_length)),
            self.max_depth - match_length,
        )
        confidence, score, out = 1.0, 0.0, []
        while len(out) < max_tokens and node.children:
            total = sum(child.count for child in node.children.values())
            token, child = max(node.children.items(), key=lambda item: item[1].count)
            confidence *= child.count / total
            if confidence < self.min_token_prob:
                break
            out.append(token)
            score += confidence
            node = child
        return score, out

    def release(self, request_id: str, token_ids: Sequence[int], num_prompt_tokens: int) -> None:
        self._requests.pop(request_id, None)
        output = list(token_ids[num_prompt_tokens:])
        if not output or self.max_cached_requests == 0:
            return
        self.shared.add(output)
        self._cached_outputs.append(output)
        while len(self._cached_outputs) > self.max_cached_requests:
            self.shared.remove(self._cached_outputs.popleft())


def _score(candidate: tuple[float, list[int]]) -> float:
    return candidate[0]
