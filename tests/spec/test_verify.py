"""Verification keeps the target distribution exactly (statistical tests on a tiny vocabulary, with
a check that a wrong rule fails them), matches plain sampling token for token where it should, and
feeds penalties the drafts as history."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from gossamer.runner.sampler import Sampler, SamplingRow
from gossamer.sampling_params import SamplingParams
from gossamer.spec.tree import TreeShape
from gossamer.spec.verify import (
    accept_point_mass,
    accept_point_mass_tree,
    greedy_accept,
    greedy_accept_tree,
    race,
    rejection_sample,
    rejection_sample_tree,
    verify,
)

# Target P[a] and draft Q[a]: next-token distributions after token a (vocabulary of 4).
P = torch.tensor(
    [
        [0.50, 0.30, 0.15, 0.05],
        [0.10, 0.20, 0.30, 0.40],
        [0.25, 0.25, 0.25, 0.25],
        [0.70, 0.10, 0.10, 0.10],
    ]
)
Q = torch.tensor(
    [
        [0.10, 0.60, 0.10, 0.20],
        [0.40, 0.10, 0.40, 0.10],
        [0.05, 0.05, 0.10, 0.80],
        [0.30, 0.30, 0.20, 0.20],
    ]
)
START = 0
NUM_DRAFTS = 2
SAMPLES = 12000
THRESHOLD = 0.04  # the total variation of 12000 exact draws is about 0.012 +- 0.004


def exact_pairs() -> dict[tuple[int, int], float]:
    return {(a, b): float(P[START, a] * P[a, b]) for a in range(4) for b in range(4)}


def total_variation(samples: list[tuple[int, int]]) -> float:
    counts = Counter(samples)
    exact = exact_pairs()
    return 0.5 * sum(abs(counts[pair] / len(samples) - p) for pair, p in exact.items())


def first_two_tokens(round_fn, generator: torch.Generator) -> tuple[int, int]:
    """Speculative rounds from START until two tokens exist; `round_fn(last, generator)` returns
    the tokens one round emits."""
    tokens: list[int] = []
    while len(tokens) < 2:
        tokens += round_fn(tokens[-1] if tokens else START, generator)
    return tokens[0], tokens[1]


def draft_model_round(last: int, generator: torch.Generator, verify_fn=rejection_sample):
    drafts, previous = [], last
    for _ in range(NUM_DRAFTS):
        previous = int(torch.multinomial(Q[previous], 1, generator=generator))
        drafts.append(previous)
    contexts = [last, *drafts]
    probs = P[contexts]  # row j: after drafts[:j]
    draft_probs = Q[contexts[:-1]]
    return verify_fn(probs, drafts, draft_probs, generator)


def point_mass_round(last: int, generator: torch.Generator):
    # a deterministic proposer: always the draft model's most likely token
    drafts, previous = [], last
    for _ in range(NUM_DRAFTS):
        previous = int(Q[previous].argmax())
        drafts.append(previous)
    return accept_point_mass(P[[last, *drafts]], drafts, generator)


def resample_from_target(probs, drafts, draft_probs, generator):
    """A wrong rule: on rejection draw from p instead of norm(max(0, p - q))."""
    tokens = []
    for j, token in enumerate(drafts):
        p, q = float(probs[j, token]), float(draft_probs[j, token])
        if float(torch.rand(1, generator=generator)) * q < p:
            tokens.append(token)
            continue
        return tokens + [race(probs[j], generator)]
    return tokens + [race(probs[len(drafts)], generator)]


def accept_always(probs, drafts, draft_probs, generator):
    """A wrong rule: trust the draft."""
    return list(drafts) + [race(probs[len(drafts)], generator)]


def sample_pairs(round_fn) -> list[tuple[int, int]]:
    generator = torch.Generator().manual_seed(1234)
    return [first_two_tokens(round_fn, generator) for _ in range(SAMPLES)]


def test_rejection_sampling_keeps_the_target_distribution():
    assert total_variation(sample_pairs(draft_model_round)) < THRESHOLD


def test_point_mass_drafts_keep_the_target_distribution():
    assert total_variation(sample_pairs(point_mass_round)) < THRESHOLD


@pytest.mark.parametrize("wrong_rule", [resample_from_target, accept_always])
def test_the_statistical_test_catches_wrong_rules(wrong_rule):
    def wrong_round(last, generator):
        return draft_model_round(last, generator, verify_fn=wrong_rule)

    assert total_variation(sample_pairs(wrong_round)) > 2 * THRESHOLD


def test_accepts_every_draft_when_draft_and_target_agree():
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        drafts = [int(torch.multinomial(P[START], 1, generator=generator))]
        tokens = rejection_sample(P[[START, drafts[0]]], drafts, P[[START]], generator)
        assert tokens[0] == drafts[0] and len(tokens) == 2


def test_greedy_accept():
    assert greedy_accept([5, 6, 7], [5, 6]) == [5, 6, 7]
    assert greedy_accept([5, 9, 7], [5, 6]) == [5, 9]
    assert greedy_accept([4, 6, 7], [5, 6]) == [4]
    assert greedy_accept([3], []) == [3]


def _row(params: SamplingParams, output: list[int], generator=None) -> SamplingRow:
    return SamplingRow(params, [1, 2, 3], list(output), generator, (0,))


def test_seeded_point_mass_verification_draws_what_plain_sampling_draws():
    """One exponential-race draw per emitted token from the request's generator: the tokens are
    those that sampling one token at a time would give (so seeded runs do not change)."""
    vocab, params = 6, SamplingParams(temperature=0.8, top_k=4, seed=3)
    gen = torch.Generator().manual_seed(0)
    for trial in range(40):
        logits = torch.randn(4, vocab, generator=gen) * 2
        plain_gen = torch.Generator().manual_seed(trial)
        sampler = Sampler()
        plain = [
            sampler.sample(logits[j : j + 1], [_row(params, [], plain_gen)]).token_ids[0]
            for j in range(4)
        ]
        # drafts that agree with the plain draws for a while, then differ
        cut = trial % 4
        drafts = plain[:cut] + [(plain[cut] + 1) % vocab] if cut < 3 else plain[:3]
        tokens, _, _ = verify(
            logits[: len(drafts) + 1],
            [_row(params, [], torch.Generator().manual_seed(trial))],
            [drafts],
            [None],
            torch.Generator(),
        )
        accepted = next(
            (j for j, (d, p) in enumerate(zip(drafts, plain, strict=False)) if d != p), 3
        )
        assert tokens[0] == plain[: accepted + 1]


def test_penalties_and_min_tokens_see_the_drafts_as_history():
    vocab = 5
    params = SamplingParams(
        temperature=0, repetition_penalty=1.6, frequency_penalty=1.0, min_tokens=3
    )
    gen = torch.Generator().manual_seed(5)
    for _ in range(30):
        logits = torch.randn(4, vocab, generator=gen)
        # sequential reference: each position's history holds the tokens chosen before it
        history, plain = [4], []
        sampler = Sampler()
        for j in range(4):
            token = sampler.sample(logits[j : j + 1], [_row(params, history)]).token_ids[0]
            plain.append(token)
            history = history + [token]
        tokens, _, _ = verify(logits, [_row(params, [4])], [plain[:3]], [None], torch.Generator())
        assert tokens[0] == plain  # every draft was the reference's choice: all accepted
        assert 0 not in tokens[0][:2]  # EOS (id 0) banned before min_tokens


def test_verify_mixes_greedy_random_and_drafted_rows_with_logprobs():
    vocab = 7
    gen = torch.Generator().manual_seed(9)
    greedy = SamplingParams(temperature=0, logprobs=2)
    random = SamplingParams(temperature=1.0, seed=1)
    logits = torch.randn(3 + 1 + 2, vocab, generator=gen)
    drafts = [
        [int(logits[0].argmax()), int(logits[1].argmax())],  # greedy, both right
        [],
        [3],
    ]
    rows = [_row(greedy, []), _row(random, [], torch.Generator().manual_seed(2)), _row(random, [])]
    q = torch.full((1, vocab), 1 / vocab)
    tokens, logprobs, paths = verify(logits, rows, drafts, [None, None, q], torch.Generator())
    assert tokens[0] == [*drafts[0], int(logits[2].argmax())]
    assert len(tokens[1]) == 1 and 1 <= len(tokens[2]) <= 2
    assert paths[0] == [0, 1] and paths[1] == [] and len(paths[2]) == len(tokens[2]) - 1
    assert [lp.token_id for lp in logprobs[0]] == tokens[0]
    expected = torch.log_softmax(logits[2], -1)[tokens[0][2]]
    assert logprobs[0][2].logprob == pytest.approx(float(expected), abs=1e-5)
    assert logprobs[1] == [None] and all(lp is None for lp in logprobs[2])


# ---- tree drafts -----------------------------------------------------------------------------------

TREE = TreeShape.from_branching([2, 2])  # two children of the root, two of each: depth 2


def tree_contexts(last: int, draft: list[int]) -> list[int]:
    """The token each verified row follows (P is a Markov chain): the root, then every node."""
    return [last, *draft]


def top_k_tree(last: int) -> list[int]:
    """The draft proposers' rule: node i is its parent's ranks[i]-th most likely token under Q."""
    draft: list[int] = []
    for parent, rank in zip(TREE.parents, TREE.ranks, strict=True):
        context = last if parent < 0 else draft[parent]
        draft.append(int(Q[context].argsort(descending=True, stable=True)[rank]))
    return draft


def top_k_tree_round(last: int, generator: torch.Generator):
    draft = top_k_tree(last)
    probs = P[tree_contexts(last, draft)]
    return accept_point_mass_tree(probs, draft, TREE.parents, generator)[0]


def sampled_tree_round(last: int, generator: torch.Generator):
    """Children drawn independently (with replacement) from the parent's Q."""
    draft: list[int] = []
    for parent in TREE.parents:
        context = last if parent < 0 else draft[parent]
        draft.append(int(torch.multinomial(Q[context], 1, generator=generator)))
    draft_probs = Q[[last if p < 0 else draft[p] for p in TREE.parents]]
    probs = P[tree_contexts(last, draft)]
    return rejection_sample_tree(probs, draft, TREE.parents, draft_probs, generator)[0]


def top_k_tree_with_draft_q(last: int, generator: torch.Generator):
    """A wrong rule: top-k children verified against the draft's distribution, as if sampled."""
    draft = top_k_tree(last)
    draft_probs = Q[[last if p < 0 else draft[p] for p in TREE.parents]]
    probs = P[tree_contexts(last, draft)]
    return rejection_sample_tree(probs, draft, TREE.parents, draft_probs, generator)[0]


def first_child_always(last: int, generator: torch.Generator):
    """A wrong rule: trust the most likely child at every node."""
    draft = top_k_tree(last)
    return [draft[0], draft[2], race(P[draft[2]], generator)]


@pytest.mark.parametrize("round_fn", [top_k_tree_round, sampled_tree_round])
def test_tree_verification_keeps_the_target_distribution(round_fn):
    assert total_variation(sample_pairs(round_fn)) < THRESHOLD


@pytest.mark.parametrize("wrong_rule", [top_k_tree_with_draft_q, first_child_always])
def test_the_tree_statistical_test_catches_wrong_rules(wrong_rule):
    assert total_variation(sample_pairs(wrong_rule)) > 2 * THRESHOLD


def test_greedy_tree_acceptance_is_the_longest_argmax_path():
    gen = torch.Generator().manual_seed(4)
    vocab = 5
    for _ in range(200):
        table = torch.randn(vocab, vocab, generator=gen)  # argmax after token a: table[a].argmax
        last = int(torch.randint(vocab, (1,), generator=gen))
        tree = TreeShape.from_branching([2, 2, 1])
        guess = torch.randn(vocab, vocab, generator=gen)  # a draft model: top-k children
        draft: list[int] = []
        for parent, rank in zip(tree.parents, tree.ranks, strict=True):
            context = last if parent < 0 else draft[parent]
            draft.append(int(guess[context].argsort(descending=True)[rank]))
        argmax = table[[last, *draft]].argmax(dim=-1).tolist()
        emitted, path = greedy_accept_tree(argmax, draft, tree.parents)
        greedy = [last]
        for _ in range(tree.max_depth + 1):
            greedy.append(int(table[greedy[-1]].argmax()))
        assert emitted == greedy[1 : len(emitted) + 1]
        longest = max(
            (tree.depths[node] for node in range(tree.num_nodes) if _tokens(tree, draft, node)
             == greedy[1 : tree.depths[node] + 1]),
            default=0,
        )  # fmt: skip
        assert len(path) == longest == len(emitted) - 1
        assert [draft[node] for node in path] == emitted[:-1]
        assert all(tree.parents[b] == a for a, b in zip([-1, *path], path, strict=False))


def _tokens(tree: TreeShape, draft: list[int], node: int) -> list[int]:
    tokens = []
    while node >= 0:
        tokens.append(draft[node])
        node = tree.parents[node]
    return tokens[::-1]


def test_tree_rows_see_their_own_path_as_history():
    """Penalties and min_tokens of node i's row see exactly the tokens of its path: a tree whose
    first branch is the sequential reference's choices is accepted to the end, siblings aside."""
    vocab = 6
    params = SamplingParams(temperature=0, repetition_penalty=1.8, min_tokens=2)
    gen = torch.Generator().manual_seed(6)
    tree = TreeShape.from_branching([2, 1, 1])  # branches 0 -> 2 -> 4 and 1 -> 3 -> 5
    for _ in range(30):
        logits = torch.randn(1 + tree.num_nodes, vocab, generator=gen)
        draft = torch.randint(vocab, (tree.num_nodes,), generator=gen).tolist()
        history, plain = [4], []
        sampler = Sampler()
        for node in (None, 0, 2, 4):
            row = 0 if node is None else 1 + node
            token = sampler.sample(logits[row : row + 1], [_row(params, history)]).token_ids[0]
            plain.append(token)
            history = history + [token]
        draft[0], draft[2], draft[4] = plain[:3]
        draft[1] = (plain[0] + 1) % vocab  # a sibling that never matches
        tokens, _, paths = verify(
            logits, [_row(params, [4])], [draft], [None], torch.Generator(), [tree.parents]
        )
        assert tokens[0] == plain and paths[0] == [0, 2, 4]
