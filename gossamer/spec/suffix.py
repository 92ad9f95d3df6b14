"""Suffix proposer: frequency counts of recent n-grams (SuffixDecoding's idea, simplified).

Two structures count every substring of length <= `max_depth` with how often it occurred:

- one per request, over its own prompt + output: a growing suffix array of its tokens
  (gossamer/spec/suffix_array.py), sorted by numpy at the request's first proposal (~0.1 ms for
  a 1k-token prompt) and grown by one row per token after that;
- one shared trie, over the outputs of the last `max_cached_requests` finished requests
  (agentic and templated workloads repeat whole passages across requests). Adding an output
  costs ~max_depth node operations per token (~20 us a token on the H200 machine's host), so
  outputs are added (and evicted) a bounded number of tokens per `propose` call, and in small
  chunks while the engine waits for the GPU (`background_work`): a batch that finishes at once
  does not stall one step. An output evicted before it was added is never added.

To propose, take the longest suffix of the request's tokens that occurred before with at least
one continuation, then walk down greedily, always to the most frequent continuation (ties: the
one that occurred first). Each step multiplies a confidence by that continuation's share of all
continuations; the walk stops when the confidence drops below `min_token_prob`, or after
`max_spec_factor * match length` tokens (a short match earns a short draft), or
`num_speculative_tokens`. Both structures propose and the one with the larger expected number
of accepted tokens (the sum of the confidences) wins.

Every engine step proposes for every decoding request, so the per-call work is kept small:
both longest matches carry over from the last call (a request usually gained a token or a few
that extend its match), and no structure is rebuilt per step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from gossamer.spec.proposer import BaseProposer, Draft, SpecRequest
from gossamer.spec.suffix_array import SuffixArray
from gossamer.spec.suffix_trie import ROOT, TOKEN_SPAN, Step, SuffixAppender, SuffixTrie

# Tokens of finished outputs the shared trie takes in per `propose` call. Taking in a token costs
# ~max_depth node operations, ~20 us on the H200 machine's host: more than a batch-8 step of
# gpt-oss-mini emits per token, so on a host-bound engine the trie cannot keep up and lags
# instead; the rest is taken in while the engine waits for the GPU (`background_work`). Measured
# (session 10, `spec_decode.py e2e --profile`): an eighth of the backlog per call made proposals
# after a batch of 1k-token outputs ended ~12 ms each (profiled), 64 tokens ~3 ms.
SHARED_TOKENS_PER_CALL = 16
# Tokens per `background_work` call: one (~20 us on the H200 host), since the engine calls it
# until its step's tokens are ready and the last call runs past that.
SHARED_TOKENS_PER_SLACK_CALL = 1


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
        self.version = 0  # bumped whenever the trie may change (node ids are reused)

    def push(self, output: list[int]) -> None:
        if not output or self.capacity == 0:
            return
        self.cached.append(output)
        self._enqueue(output, SuffixAppender(self.trie))
        while len(self.cached) > self.capacity:
            evicted = self.cached.popleft()
            if not self._cancel_add(evicted):
                self._enqueue(evicted, None)

    def _cancel_add(self, output: list[int]) -> bool:
        """Drops `output`'s add from the queue if none of it was added yet."""
        for index, (queued, appender, done) in enumerate(self._queue):
            if queued is output and appender is not None:
                if done:
                    return False
                del self._queue[index]
                self.backlog -= len(output)
                return True
        return False

    def _enqueue(self, output: list[int], appender: SuffixAppender | None) -> None:
        self._queue.append((output, appender, 0))
        self.backlog += len(output)

    def catch_up(self, budget: int = SHARED_TOKENS_PER_CALL) -> None:
        """Add or evict up to `budget` queued tokens, in queue order."""
        if self._queue:
            self.version += 1
        while self._queue and budget > 0:
            output, appender, done = self._queue.popleft()
            end = min(done + budget, len(output))
            if appender is not None:
                appender.extend(output[done:end])
            else:
                self.trie.remove(output, done, end)
            budget -= end - done
            self.backlog -= end - done
            if end < len(output):
                self._queue.appendleft((output, appender, end))

    def longest_match(self, tokens: Sequence[int], cursor: _SharedCursor) -> tuple[int, int] | None:
        """(length, node) of the longest suffix of `tokens` with a continuation."""
        trie = self.trie
        if trie.is_empty():
            return None
        cursor.follow(self, tokens)
        for length in range(len(cursor.active), 0, -1):
            node = cursor.active[length - 1]
            if trie.has_counted_child(node):
                return length, node
        return None


class _SharedCursor:
    """One request's suffixes in the shared trie: `active[m - 1]` is the node of its suffix of
    length m, for every m up to the longest one there (a trie holding a string holds its
    suffixes). Kept between calls: a new token extends it in a few dict lookups, where
    searching every suffix afresh cost up to max_depth lookups per suffix length."""

    __slots__ = ("active", "size", "version")

    def __init__(self) -> None:
        self.active: list[int] = []
        self.size = 0  # the tokens it has followed
        self.version = -1  # the shared trie's version it holds nodes of

    def follow(self, shared: _RecentOutputs, tokens: Sequence[int]) -> None:
        """Bring `active` to the end of `tokens` (the request's tokens, grown since)."""
        depth = shared.trie.max_depth
        recent = max(len(tokens) - (depth - 1), 0)  # the suffixes kept start there or later
        if self.version != shared.version or self.size < recent:
            self.active, self.size = [], recent
        edges, active = shared.trie.edges, self.active
        for token in tokens[self.size :]:
            node = edges.get(ROOT * TOKEN_SPAN + token)
            if node is None:  # nor any longer suffix ending with it
                active = []
                continue
            extended = [node]
            for parent in active[: depth - 2]:
                node = edges.get(parent * TOKEN_SPAN + token)
                if node is None:
                    break
                extended.append(node)
            active = extended
        self.active, self.size, self.version = active, len(tokens), shared.version


class _RequestState:
    """What the proposer keeps per request: its suffix array and its cursor in the shared trie."""

    __slots__ = ("array", "shared")

    def __init__(self, tokens: Sequence[int], depth: int) -> None:
        self.array = SuffixArray(tokens, depth)
        self.shared = _SharedCursor()


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
        self._requests: dict[str, _RequestState] = {}

    def propose(self, requests: Sequence[SpecRequest]) -> list[Draft | None]:
        self.shared.catch_up()
        return [self._propose_one(request) for request in requests]

    def _propose_one(self, request: SpecRequest) -> Draft | None:
        limit = min(self.num_speculative_tokens, request.max_draft_tokens)
        best: tuple[float, list[int]] = (0.0, [])
        state = self._request_state(request)
        own = state.array.longest_match()
        if own is not None:
            best = self._walk(self._own_child(state.array), own, own.length, limit)
        shared = self.shared.longest_match(request.token_ids, state.shared)
        if shared is not None:
            length, node = shared
            best_child = self.shared.trie.best_child
            candidate = self._walk(lambda node, _: best_child(node), node, length, limit)
            best = max(best, candidate, key=_score)
        return Draft(best[1]) if best[1] else None

    def _own_child(self, array: SuffixArray):
        min_prob = self.min_token_prob
        return lambda context, confidence: array.best_child(context, confidence, min_prob)

    def _request_state(self, request: SpecRequest) -> _RequestState:
        state = self._requests.get(request.request_id)
        if state is None:
            state = self._requests[request.request_id] = _RequestState(
                request.token_ids, self.max_depth
            )
        state.array.extend(request.token_ids)
        return state

    def _walk(self, best_child, node, match_length: int, limit: int) -> tuple[float, list[int]]:
        """Greedy most-frequent path below `node` (`best_child(node, confidence)` steps down
        one, None at a leaf or where no child is frequent enough to keep the confidence):
        (expected accepted tokens, tokens)."""
        max_tokens = min(
            limit,
            max(1, int(self.max_spec_factor * match_length)),
            self.max_depth - match_length,
        )
        confidence, score, out = 1.0, 0.0, []
        step: Step | None
        while len(out) < max_tokens and (step := best_child(node, confidence)) is not None:
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

    def background_work(self) -> bool:
        """A chunk of the shared trie's queue; whether more is left."""
        self.shared.catch_up(SHARED_TOKENS_PER_SLACK_CALL)
        return self.shared.backlog > 0


def _score(candidate: tuple[float, list[int]]) -> float:
    return candidate[0]
