"""The suffix proposer against a brute-force reference: its growing suffix array counts every
substring exactly once (rows and fringe), before and after tokens arrive; the shared trie takes
finished outputs in over several calls; batches of requests that finish and start, with their
cursors kept between calls, propose exactly what an exhaustive search proposes."""

from __future__ import annotations

import random

import pytest

from benchmarks.suffix_cost import text_tokens
from gossamer.spec import suffix_array
from gossamer.spec.proposer import SpecRequest
from gossamer.spec.suffix import (
    SHARED_TOKENS_PER_CALL,
    SHARED_TOKENS_PER_SLACK_CALL,
    SuffixProposer,
)
from gossamer.spec.suffix_array import SuffixArray
from gossamer.spec.suffix_trie import ROOT, SuffixTrie
from tests.spec.test_proposers import ROW, propose, spec


def reference_children(tokens: list[int], context: list[int]) -> dict[int, tuple[int, int]]:
    """token -> (how often it followed `context`, where context + token first starts)."""
    found: dict[int, tuple[int, int]] = {}
    width = len(context)
    for start in range(len(tokens) - width):
        if tokens[start : start + width] == context:
            count, first = found.get(tokens[start + width], (0, start))
            found[tokens[start + width]] = (count + 1, first)
    return found


def reference_draft(tokens, depth, limit, spec_factor, min_prob) -> list[int] | None:
    """The proposer's rule by exhaustive search over the request's own tokens."""
    for length in range(min(depth - 1, len(tokens)), 0, -1):
        context = tokens[len(tokens) - length :]
        if reference_children(tokens, context):
            break
    else:
        return None
    max_tokens = min(limit, max(1, int(spec_factor * length)), depth - length)
    confidence, out = 1.0, []
    while len(out) < max_tokens:
        children = reference_children(tokens, context + out)
        if not children:
            break
        total = sum(count for count, _ in children.values())
        token = min(children, key=lambda t: (-children[t][0], children[t][1]))
        confidence *= children[token][0] / total
        if confidence < min_prob:
            break
        out.append(token)
    return out or None


@pytest.mark.parametrize("seed", range(12))
def test_proposals_match_brute_force_as_the_request_grows(seed):
    """Small vocabularies give long matches, many ties and deep walks; the request first
    proposes after a random prefix (the suffix array's part), then grows by 1-5 tokens a step
    (the trie's part), sometimes with repeats of an earlier stretch."""
    rng = random.Random(seed)
    depth = rng.choice([2, 3, 4, 6, 8, 16])
    limit = rng.randint(1, 8)
    spec_factor = rng.choice([0.5, 1.0, 3.0])
    min_prob = rng.choice([0.0, 0.1, 0.4])
    vocab = rng.randint(2, 6)
    proposer = SuffixProposer(limit, depth, 0, spec_factor, min_prob)
    tokens = [rng.randrange(vocab) for _ in range(rng.randint(1, 60))]
    for _ in range(40):
        expected = reference_draft(tokens, depth, limit, spec_factor, min_prob)
        assert propose(proposer, tokens) == expected, (len(tokens), tokens)
        if rng.random() < 0.3 and len(tokens) > 8:
            start = rng.randrange(len(tokens) - 4)
            tokens += tokens[start : start + rng.randint(1, 5)]
        else:
            tokens += [rng.randrange(vocab) for _ in range(rng.randint(1, 5))]


def test_a_long_prompt_with_a_large_vocabulary_matches_brute_force():
    rng = random.Random(7)
    phrases = [[rng.randrange(50_000) for _ in range(rng.randint(3, 12))] for _ in range(20)]
    tokens = [token for _ in range(60) for token in rng.choice(phrases)]
    proposer = SuffixProposer(6, max_depth=16, max_cached_requests=0)
    for _ in range(30):
        assert propose(proposer, tokens) == reference_draft(tokens, 16, 6, 1.0, 0.1)
        tokens += rng.choice(phrases)[: rng.randint(1, 4)]


@pytest.mark.parametrize("seed", range(4))
def test_suffix_array_counts_every_substring_as_it_grows(seed):
    """Rows (suffixes of `depth` tokens and more) and the fringe (the last depth - 1 suffixes)
    together hold every occurrence once, before and after tokens arrive one at a time; the best
    child is the brute-force one, or None when its confidence would fall below min_prob."""
    rng = random.Random(seed)
    depth = rng.choice([2, 3, 5, 8])
    vocab = rng.choice([2, 4, 1 << 20])
    tokens = [rng.randrange(vocab) for _ in range(rng.randint(0, 40))]
    array = SuffixArray(tokens, depth)
    for _ in range(60):
        for _ in range(10):
            start = rng.randrange(len(tokens) + 1)
            context = tokens[start : start + rng.randint(1, depth - 1)] or [0]
            located = array.locate(encode(context))
            occurrences = sum(
                tokens[s : s + len(context)] == context
                for s in range(len(tokens) - len(context) + 1)
            )
            assert located.hi - located.lo + len(located.fringe) == occurrences
            expected = reference_children(tokens, context)
            confidence, min_prob = rng.choice([(1.0, 0.0), (1.0, 0.3), (0.5, 0.2)])
            child = array.best_child(located, confidence, min_prob)
            if not expected:
                assert child is None
                continue
            total = sum(count for count, _ in expected.values())
            best = min(expected, key=lambda t: (-expected[t][0], expected[t][1]))
            if confidence * (expected[best][0] / total) < min_prob:
                assert child is None
            else:
                assert child[:3] == (best, expected[best][0], total)
                deeper = child[3]
                assert deeper.hi - deeper.lo + len(deeper.fringe) == expected[best][0]
        tokens.append(rng.randrange(vocab))
        array.extend(tokens)


@pytest.mark.parametrize("sort_bytes_below", [0, 1 << 30], ids=["doubling", "bytes"])
@pytest.mark.parametrize("seed", range(6))
def test_suffix_array_rows_are_sorted_either_way(seed, sort_bytes_below, monkeypatch):
    """Both sorts (integer prefix doubling for long prompts, bytes for short ones) give the rows
    in bytes order, each row the `depth` tokens from its start."""
    monkeypatch.setattr(suffix_array, "SORT_BYTES_BELOW", sort_bytes_below)
    rng = random.Random(seed)
    depth = rng.choice([1, 2, 5, 16])
    vocab = rng.choice([1, 3, 300, (1 << 32) - 2])
    phrases = [[rng.randrange(vocab) for _ in range(rng.randint(1, 9))] for _ in range(5)]
    tokens = random_text(rng, phrases, rng.randint(0, 300))
    array = SuffixArray(tokens, depth)
    assert array.keys == sorted(array.keys)
    assert len(array.keys) == max(len(tokens) - depth + 1, 0)
    for key, start in zip(array.keys, array.starts, strict=True):
        assert key == encode(tokens[start : start + depth])


def encode(tokens: list[int]) -> bytes:
    return b"".join(token.to_bytes(4, "big") for token in tokens)


def test_finished_outputs_are_taken_in_over_several_calls():
    """A long output is not added in one step; once the queue is worked off the shared trie
    holds what adding it at once would have, and evictions follow in order."""
    rng = random.Random(5)
    output = [rng.randrange(30) for _ in range(10 * SHARED_TOKENS_PER_CALL)]
    proposer = SuffixProposer(4, max_depth=6, max_cached_requests=1)
    proposer.release("done", [1, 2] + output, 2)
    calls = 0
    while proposer.shared.backlog:
        proposer.propose([])
        calls += 1
    assert calls > 2
    reference = SuffixTrie(6)
    reference.add(output)
    assert trie_counts(proposer.shared.trie) == trie_counts(reference)
    proposer.release("next", [1, 7, 8, 9], 1)  # evicts the long output
    while proposer.shared.backlog:
        proposer.propose([])
    reference = SuffixTrie(6)
    reference.add([7, 8, 9])
    assert trie_counts(proposer.shared.trie) == trie_counts(reference)


def test_an_output_evicted_before_it_was_taken_in_is_never_added():
    """Capacity 1: three outputs finish before any is taken in; only the last is added, and
    the backlog counts only its tokens."""
    proposer = SuffixProposer(4, max_depth=6, max_cached_requests=1)
    for request_id, output in (("a", [3, 4, 5]), ("b", [6, 7]), ("c", [8, 9, 10, 11])):
        proposer.release(request_id, [1] + output, 1)
    assert proposer.shared.backlog == 4
    while proposer.shared.backlog:
        proposer.propose([])
    reference = SuffixTrie(6)
    reference.add([8, 9, 10, 11])
    assert trie_counts(proposer.shared.trie) == trie_counts(reference)


def test_background_work_takes_in_outputs_in_small_chunks():
    """What the engine runs while it waits for the GPU: a chunk per call, True while more is
    left, and the same trie as taking the output in at once."""
    rng = random.Random(8)
    chunks = 6
    output = [rng.randrange(30) for _ in range(chunks * SHARED_TOKENS_PER_SLACK_CALL)]
    proposer = SuffixProposer(4, max_depth=6)
    proposer.release("done", [1, 2] + output, 2)
    results = []
    while proposer.shared.backlog:
        before = proposer.shared.backlog
        results.append(proposer.background_work())
        assert before - proposer.shared.backlog == min(before, SHARED_TOKENS_PER_SLACK_CALL)
    assert results == [True] * (chunks - 1) + [False]
    assert proposer.background_work() is False
    reference = SuffixTrie(6)
    reference.add(output)
    assert trie_counts(proposer.shared.trie) == trie_counts(reference)


def test_proposals_use_a_finished_output_once_taken_in():
    proposer = SuffixProposer(3, max_depth=8)
    proposer.release("a", [100, 101, 10, 11, 12, 13, 14], 2)
    assert propose(proposer, [200, 10, 11], request_id="b") == [12, 13]


def test_shared_ties_go_to_the_earliest_continuation():
    proposer = SuffixProposer(1, max_depth=4, min_token_prob=0.5)
    proposer.release("a", [5, 1, 5, 2, 5, 3], 0)  # after 5: 1, 2 and 3 once each
    proposer.release("b", [5, 2], 0)  # now 2 twice
    assert propose(proposer, [9, 5], request_id="c", max_drafts=1) == [2]
    proposer = SuffixProposer(1, max_depth=4, min_token_prob=0.3)
    proposer.release("a", [5, 3, 5, 1, 5, 2], 0)
    assert propose(proposer, [9, 5], request_id="c", max_drafts=1) == [3]


def trie_counts(trie: SuffixTrie, node: int = ROOT, prefix=()) -> dict[tuple[int, ...], int]:
    counts = {}
    for token, child in trie.children(node):
        counts[prefix + (token,)] = trie.counts[child]
        counts |= trie_counts(trie, child, prefix + (token,))
    return counts


def test_release_forgets_the_request_and_propose_without_requests_is_fine():
    proposer = SuffixProposer(4)
    assert proposer.propose([]) == []
    propose(proposer, [1, 2, 3, 1, 2], request_id="x")
    proposer.release("x", [1, 2, 3, 1, 2], 5)
    assert not proposer._requests
    assert spec([1]).token_ids == [1]


def test_trie_add_and_remove_match_counted_substrings_and_reuse_freed_nodes():
    rng = random.Random(11)
    trie = SuffixTrie(max_depth=4)
    held: list[list[int]] = []
    for _ in range(200):
        if held and rng.random() < 0.5:
            trie.remove(held.pop(rng.randrange(len(held))))
        else:
            held.append([rng.randrange(5) for _ in range(rng.randint(1, 12))])
            trie.add(held[-1])
        expected: dict[tuple[int, ...], int] = {}
        for tokens in held:
            for start in range(len(tokens)):
                for end in range(start + 1, min(start + 4, len(tokens)) + 1):
                    key = tuple(tokens[start:end])
                    expected[key] = expected.get(key, 0) + 1
        assert trie_counts(trie) == expected
    for tokens in held:
        trie.remove(tokens)
    assert trie.is_empty() and not trie.edges
    size = len(trie.counts)
    trie.add([rng.randrange(5) for _ in range(12)])
    assert len(trie.counts) == size  # every node from the ids freed before


# ---- the whole proposer (own index + shared outputs) against a brute-force reference ----------


class ReferenceShared:
    """The shared trie's substring counts as a dict, with each substring's creation time: among
    equally frequent continuations the trie prefers the one whose node is oldest (a node freed
    when its count drops to zero is new when it comes back). Released outputs are taken in, and
    evicted ones removed, in order at `drain`; one evicted before that is never taken in."""

    def __init__(self, depth: int, capacity: int) -> None:
        self.depth, self.capacity = depth, capacity
        self.counts: dict[tuple[int, ...], int] = {}
        self.created: dict[tuple[int, ...], int] = {}
        self.cached: list[list[int]] = []
        self.queue: list[tuple[bool, list[int]]] = []  # (add, output)
        self.clock = 0

    def release(self, output: list[int]) -> None:
        if not output or self.capacity == 0:
            return
        self.cached.append(output)
        self.queue.append((True, output))
        if len(self.cached) > self.capacity:
            oldest = self.cached.pop(0)
            queued = [i for i, (add, out) in enumerate(self.queue) if add and out is oldest]
            if queued:
                del self.queue[queued[0]]
            else:
                self.queue.append((False, oldest))

    def drain(self) -> None:
        for add, output in self.queue:
            self._add(output) if add else self._remove(output)
        self.queue.clear()

    def _add(self, output: list[int]) -> None:
        for end in range(1, len(output) + 1):
            self.clock += 1
            for start in range(max(0, end - self.depth), end):
                key = tuple(output[start:end])
                if key not in self.counts:
                    self.counts[key], self.created[key] = 0, self.clock
                self.counts[key] += 1

    def _remove(self, output: list[int]) -> None:
        for start in range(len(output)):
            for end in range(start + 1, min(start + self.depth, len(output)) + 1):
                key = tuple(output[start:end])
                self.counts[key] -= 1
                if not self.counts[key]:
                    del self.counts[key], self.created[key]

    def children(self, context: list[int]) -> dict[int, tuple[int, int]]:
        """token -> (count, creation time) of context + token."""
        width = len(context) + 1
        return {
            key[-1]: (count, self.created[key])
            for key, count in self.counts.items()
            if len(key) == width and list(key[:-1]) == context
        }


def reference_walk(children_of, context, depth, limit, spec_factor, min_prob):
    """The proposer's greedy walk below `context` (children_of(x): token -> (count, tie key)):
    (sum of confidences, tokens)."""
    length = len(context)
    max_tokens = min(limit, max(1, int(spec_factor * length)), depth - length)
    confidence, score, out = 1.0, 0.0, []
    while len(out) < max_tokens:
        children = children_of(context + out)
        if not children:
            break
        total = sum(count for count, _ in children.values())
        token = min(children, key=lambda t: (children[t][0] * -1, children[t][1]))
        confidence *= children[token][0] / total
        if confidence < min_prob:
            break
        out.append(token)
        score += confidence
    return score, out


def reference_longest_context(tokens, depth, children_of) -> list[int] | None:
    for length in range(min(depth - 1, len(tokens)), 0, -1):
        if children_of(tokens[len(tokens) - length :]):
            return tokens[len(tokens) - length :]
    return None


def reference_proposal(tokens, shared_children, depth, limit, spec_factor, min_prob):
    """Own and shared walks; the larger sum of confidences wins, the own one on ties."""
    best = (0.0, [])
    own_children = lambda context: reference_children(tokens, context)  # noqa: E731
    for children_of in (own_children, shared_children):
        context = reference_longest_context(tokens, depth, children_of)
        if context is not None:
            walk = reference_walk(children_of, context, depth, limit, spec_factor, min_prob)
            best = max(best, walk, key=lambda candidate: candidate[0])
    return best[1] or None


def trie_children(trie: SuffixTrie):
    """The shared trie read without any cached state: the reference for partly taken-in outputs.
    Tie key: position in the child list, oldest first."""

    def children_of(context):
        node = trie.find(context)
        if node is None:
            return {}
        listed = list(trie.children(node))[::-1]
        return {token: (trie.counts[child], i) for i, (token, child) in enumerate(listed)}

    return children_of


def random_text(rng: random.Random, phrases, length: int) -> list[int]:
    return text_tokens(length, rng, phrases, copy_prob=0.2, copy_lengths=(2, 12))


@pytest.mark.parametrize("drained", [True, False], ids=["drained", "partly-taken-in"])
@pytest.mark.parametrize("seed", range(8))
def test_batched_proposals_with_finished_outputs_match_brute_force(seed, drained):
    """Several requests decode together, finish (their outputs go to the shared trie) and new
    ones start, drawing on one set of phrases. `drained`: the shared trie takes in every output
    before the next proposal (the reference is a dict of substring counts); otherwise it takes
    them in over several calls, and the reference reads the trie as it is, without the cursors
    the proposer keeps between calls."""
    rng = random.Random(seed)
    depth = rng.choice([2, 3, 5, 8, 16])
    limit = rng.randint(1, 6)
    spec_factor = rng.choice([0.5, 1.0, 2.0])
    min_prob = rng.choice([0.0, 0.1, 0.3])
    capacity = rng.choice([1, 2, 4])
    vocab = rng.choice([4, 12, 50])
    phrases = [[rng.randrange(vocab) for _ in range(rng.randint(1, 6))] for _ in range(8)]
    proposer = SuffixProposer(limit, depth, capacity, spec_factor, min_prob)
    shared = ReferenceShared(depth, capacity)
    running: dict[str, tuple[list[int], int]] = {}
    for step in range(60):
        while len(running) < 3:
            prompt = random_text(rng, phrases, rng.randint(1, 40))
            running[f"r{step}-{len(running)}"] = (prompt, len(prompt))
        while drained and proposer.shared.backlog:
            proposer.propose([])
        shared.drain()
        ids = list(running)
        max_drafts = {request_id: rng.randint(1, 8) for request_id in ids}
        drafts = proposer.propose(
            [SpecRequest(i, running[i][0], running[i][1], max_drafts[i], ROW) for i in ids]
        )
        shared_children = shared.children if drained else trie_children(proposer.shared.trie)
        for request_id, draft in zip(ids, drafts, strict=True):
            tokens = running[request_id][0]
            expected = reference_proposal(
                tokens,
                shared_children,
                depth,
                min(limit, max_drafts[request_id]),
                spec_factor,
                min_prob,
            )
            assert (None if draft is None else draft.token_ids) == expected, (step, request_id)
        for request_id in ids:
            tokens, num_prompt = running[request_id]
            tokens += random_text(rng, phrases, rng.randint(1, 5))
            if rng.random() < 0.1:
                del running[request_id]
                proposer.release(request_id, tokens, num_prompt)
                shared.release(tokens[num_prompt:])
