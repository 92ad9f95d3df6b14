"""The suffix proposer against a brute-force reference: its suffix array and trie count every
substring exactly once, however the request's tokens split between the two; the shared trie
takes finished outputs in over several calls."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gossamer.spec.suffix import SHARED_TOKENS_PER_CALL, SuffixProposer
from gossamer.spec.suffix_array import SuffixArray
from gossamer.spec.suffix_trie import ROOT, SuffixTrie
from tests.spec.test_proposers import propose, spec


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


def test_suffix_array_ranges_count_every_substring():
    rng = random.Random(3)
    tokens = [rng.randrange(4) for _ in range(200)]
    array = SuffixArray(np.array(tokens), depth=5)
    for _ in range(200):
        start = rng.randrange(len(tokens))
        context = tokens[start : start + rng.randint(1, 4)]
        lo, hi = 0, array.size
        for column, token in enumerate(context):
            lo, hi = array.narrow(lo, hi, column, token)
        occurrences = sum(
            tokens[s : s + len(context)] == context for s in range(len(tokens) - len(context) + 1)
        )
        assert hi - lo == occurrences
        children = array.children(lo, hi, len(context))
        expected = reference_children(tokens, context)
        assert dict(zip(children.tokens, children.counts, strict=True)) == {
            token: count for token, (count, _) in expected.items()
        }
        assert array.has_children(lo, hi, len(context)) == bool(expected)


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
