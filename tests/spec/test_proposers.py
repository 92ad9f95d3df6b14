"""The n-gram and suffix proposers on hand-made token sequences."""

from __future__ import annotations

import random

import pytest

from gossamer.runner.sampler import SamplingRow
from gossamer.sampling_params import SamplingParams
from gossamer.spec.ngram import NgramProposer
from gossamer.spec.proposer import SpecRequest
from gossamer.spec.suffix import SuffixProposer
from gossamer.spec.suffix_trie import SuffixTrie

ROW = SamplingRow(SamplingParams(temperature=0), [], [], None)


def spec(tokens: list[int], request_id: str = "r", max_drafts: int = 8) -> SpecRequest:
    return SpecRequest(request_id, tokens, len(tokens), max_drafts, ROW)


def propose(proposer, tokens, **kwargs) -> list[int] | None:
    draft = proposer.propose([spec(tokens, **kwargs)])[0]
    return None if draft is None else draft.token_ids


# ---- ngram ---------------------------------------------------------------------------------------


def test_ngram_copies_what_followed_the_longest_match():
    proposer = NgramProposer(3, min_n=1, max_n=3)
    # "7 8" occurs twice: after "1 7 8" came 9 9 9; the 3-gram match wins over the 1-gram "8"
    tokens = [1, 7, 8, 9, 9, 9, 5, 7, 8, 4, 4, 1, 7, 8]
    assert propose(proposer, tokens) == [9, 9, 9]


def test_ngram_prefers_the_most_recent_occurrence_and_respects_limits():
    proposer = NgramProposer(4, min_n=2, max_n=2)
    tokens = [3, 4, 10, 11, 12, 13, 3, 4, 20, 21, 22, 23, 3, 4]
    assert propose(proposer, tokens, request_id="a") == [20, 21, 22, 23]
    assert propose(proposer, tokens, request_id="b", max_drafts=2) == [20, 21]


def test_ngram_extends_a_short_period_past_the_end():
    proposer = NgramProposer(5, min_n=2, max_n=3)
    assert propose(proposer, [9, 1, 2, 1, 2, 1]) == [2, 1, 2, 1, 2]


def test_ngram_without_a_match_proposes_nothing_and_is_incremental():
    proposer = NgramProposer(3, min_n=2, max_n=4)
    tokens = [1, 2, 3, 4, 5]
    assert propose(proposer, tokens) is None
    tokens += [1, 2]  # the same list grows, as the scheduler's does
    assert propose(proposer, tokens) == [3, 4, 5]
    tokens += [3, 4, 5, 1, 2]
    assert propose(proposer, tokens) == [3, 4, 5]
    proposer.release("r", tokens, 5)
    assert not proposer._indexes


def brute_force_ngram(tokens: list[int], max_n: int, min_n: int, count: int) -> list[int] | None:
    """The latest earlier occurrence of the longest suffix (max_n down to min_n), continued."""
    for n in range(max_n, min_n - 1, -1):
        suffix = tokens[len(tokens) - n :]
        ends = [e for e in range(n, len(tokens)) if len(tokens) > n and tokens[e - n : e] == suffix]
        if ends:
            extended = list(tokens)
            start = ends[-1]
            for i in range(count):
                extended.append(extended[start + i])
            return extended[len(tokens) :]
    return None


@pytest.mark.parametrize(
    ("max_growth", "offset"),
    # a token at a time (a slice per gram); jumps of up to 100 tokens (from ngram._BULK new ends,
    # the grams zipped and hashed in bulk), with token ids past 2^16
    [(1, 0), (100, 200_000)],
)
def test_ngram_matches_a_brute_force_search(max_growth, offset):
    rng = random.Random(max_growth)
    proposer = NgramProposer(4, min_n=1, max_n=3)
    tokens: list[int] = []
    while len(tokens) < 600:
        tokens += [offset + rng.randrange(6) for _ in range(rng.randint(1, max_growth))]
        assert propose(proposer, tokens) == brute_force_ngram(tokens, 3, 1, 4)


# ---- suffix --------------------------------------------------------------------------------------


def test_suffix_trie_counts_and_removes_substrings():
    trie = SuffixTrie(max_depth=3)
    trie.add([1, 2, 1, 2])
    assert trie.count([1, 2]) == 2
    assert trie.count([2, 1, 2]) == 1
    assert trie.find([1, 2, 1, 2]) is None  # deeper than max_depth
    trie.add([1, 2, 3])
    assert trie.count([1, 2]) == 3
    trie.remove([1, 2, 1, 2])
    assert trie.count([1, 2]) == 1 and trie.find([2, 1]) is None
    trie.remove([1, 2, 3])
    assert trie.is_empty()


def test_suffix_proposes_the_most_frequent_continuation_of_the_request():
    proposer = SuffixProposer(4, max_depth=8, min_token_prob=0.3)
    # after "5 6": "7 8" twice, "9" once -> 7 8 (confidence 2/3), then what followed "5 6 7 8"
    tokens = [5, 6, 7, 8, 1, 5, 6, 9, 2, 5, 6, 7, 8, 3, 5, 6]
    assert propose(proposer, tokens)[:2] == [7, 8]


def test_suffix_draft_length_follows_confidence_and_match_length():
    rare = SuffixProposer(8, max_depth=12, min_token_prob=0.6)
    # after "4": 5 once and 6 once -> 50% < 60%: nothing worth drafting
    assert propose(rare, [4, 5, 1, 4, 6, 2, 4]) is None
    short = SuffixProposer(8, max_depth=12, max_spec_factor=1.0, min_token_prob=0.1)
    # a 2-token match earns at most 2 drafts
    assert propose(short, [30, 31, 1, 2, 3, 4, 5, 6, 40, 30, 31]) == [1, 2]


def test_suffix_learns_from_finished_requests_and_forgets_old_ones():
    proposer = SuffixProposer(3, max_depth=8, max_cached_requests=1)
    first = [100, 101, 10, 11, 12, 13, 14]  # prompt 2 tokens, output 5
    proposer.propose([spec(first, "a")])
    proposer.release("a", first, 2)
    assert propose(proposer, [200, 10, 11], request_id="b") == [12, 13]  # 2-token match
    second = [100, 50, 51, 52]
    proposer.release("c", second, 1)  # evicts the first output (max_cached_requests=1)
    assert propose(proposer, [201, 10, 11], request_id="d") is None
    assert propose(proposer, [202, 50], request_id="e") == [51]
