"""Verification keeps the target distribution exactly (statistical tests on a tiny vocabulary, with
a check that a wrong rule fails them), matches plain sampling token for token where it should, and
feeds penalties the drafts as history."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from gossamer.runner.sampler import Sampler, SamplingRow
from gossamer.sampling_params import SamplingParams
from gossamer.spec.verify import (
    accept_point_mass,
    greedy_accept,
    race,
    rejection_sample,
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
        tokens, _ = verify(
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
        tokens, _ = verify(logits, [_row(params, [4])], [plain[:3]], [None], torch.Generator())
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
    tokens, logprobs = verify(logits, rows, drafts, [None, None, q], torch.Generator())
    assert tokens[0] == [*drafts[0], int(logits[2].argmax())]
    assert len(tokens[1]) == 1 and 1 <= len(tokens[2]) <= 2
    assert [lp.token_id for lp in logprobs[0]] == tokens[0]
    expected = torch.log_softmax(logits[2], -1)[tokens[0][2]]
    assert logprobs[0][2].logprob == pytest.approx(float(expected), abs=1e-5)
    assert logprobs[1] == [None] and all(lp is None for lp in logprobs[2])
