"""The cost-aware choice of k: the step-cost table, the per-position acceptance estimates, the
decision rule against brute force, and in the engine: outputs unchanged, speculation where it pays
and none where it does not."""

from __future__ import annotations

import itertools
import random

import pytest

from gossamer.sampling_params import SamplingParams
from gossamer.spec.config import SpecConfig
from gossamer.spec.cost import (
    DEFAULT_COST_TABLE,
    AcceptanceStats,
    DraftLengthChooser,
    StepCost,
    choose_draft_lens,
    gains,
)
from tests.spec.conftest import make_engine, repetitive_prompts, run_engine

TABLE = ((1, ((0, 4.0), (1, 5.0), (3, 8.0))), (9, ((0, 10.0), (1, 20.0), (3, 30.0))))
LADDER = (1, 2, 4)


# ---- the cost table ------------------------------------------------------------------------------


def test_step_cost_interpolates_the_table():
    cost = StepCost(TABLE)
    assert cost(1, 0) == cost(9, 0) == 1.0
    assert cost(1, 1) == pytest.approx(5 / 4)
    assert cost(1, 2) == pytest.approx(6.5 / 4)  # halfway between the 5 and 8 ms of k = 1, 3
    assert cost(1, 0.5) == pytest.approx(4.5 / 4)  # fractional k: ragged steps' mean
    assert cost(1, 5) == pytest.approx(11 / 4)  # past k = 3: the last slope, 1.5 ms per draft
    assert cost(9, 1) == pytest.approx(2.0)
    assert cost(5, 1) == pytest.approx((1.25 + 2.0) / 2)  # halfway between the batch rows
    assert cost(0, 3) == cost(1, 3)  # below the first row: the first row
    # above the last row (9): a draft's share there (least squares: 0.7) grows as 64 / (64 + h)
    half_batch = 9 * 0.3 / 0.7
    growth = (64 / (64 + half_batch)) / 0.7
    assert cost(64, 3) == pytest.approx(1 + 2 * growth)
    assert cost(9, 3) < cost(64, 3) < 4


def test_the_default_table_holds_the_measured_ratios():
    cost = StepCost(DEFAULT_COST_TABLE)
    measured = [1.24, 1.50, 1.69, 2.05, 2.23, 2.46, 2.64]  # 120b, batch 1, k = 1..7
    assert [cost(1, k) for k in range(1, 8)] == pytest.approx(measured)


def test_larger_batches_pay_more_per_draft_up_to_a_whole_step():
    """Between memory bound (batch 1: a draft costs ~0.24 steps) and compute bound (a draft
    costs a step): the cost never falls as the batch grows and tends to 1 + k."""
    cost = StepCost(DEFAULT_COST_TABLE)
    batches = [1, 2, 4, 8, 16, 32, 64, 256, 4096]
    for k in range(1, 8):
        costs = [cost(batch, k) for batch in batches]
        assert costs == sorted(costs)
        assert costs[-1] <= 1 + k and costs[-1] == pytest.approx(1 + k, rel=0.05)
    # the batch-8 graph measurement of session 2 (k = 1, 2, 3), which the model never saw
    assert [cost(8, k) for k in (1, 2, 3)] == pytest.approx([1.61, 2.20, 2.83], rel=0.15)


def test_extrapolation_keeps_measured_extremes():
    free = StepCost(((1, ((0, 1.0), (1, 1.0))),))
    assert free(64, 1) == 1.0  # drafts measured free stay free
    whole = StepCost(((8, ((0, 1.0), (1, 3.0))),))  # dearer than a step per draft: kept
    assert whole(64, 1) == pytest.approx(3.0)


def test_a_falling_last_segment_is_not_extrapolated_downward():
    cost = StepCost(((1, ((0, 4.0), (1, 8.0), (2, 6.0))),))
    assert cost(1, 6) == pytest.approx(1.5)


# ---- acceptance estimates ------------------------------------------------------------------------


def test_acceptance_is_counted_per_position_given_the_earlier_ones():
    stats = AcceptanceStats(4)
    stats.record(num_drafted=4, num_accepted=2)  # 0 and 1 accepted, 2 rejected, 3 never tested
    stats.record(num_drafted=1, num_accepted=1)
    assert stats.tried == [2, 1, 1, 0]
    assert stats.accepted == [2, 1, 0, 0]
    # shrunk toward the prior by two pseudo-observations; position 3 is the prior itself
    assert stats.rates([0.5] * 4) == pytest.approx([3 / 4, 2 / 3, 1 / 3, 0.5])


def test_untried_positions_inherit_the_position_below():
    stats = AcceptanceStats(3)
    for _ in range(30):
        stats.record(num_drafted=1, num_accepted=1)
    first, second, third = stats.chained_rates()
    assert first > 0.95 and second == pytest.approx(first) and third == pytest.approx(first)


def test_evidence_fades_back_to_the_prior():
    stats = AcceptanceStats(1, decay=0.9)
    for step in range(1, 6):
        stats.record(num_drafted=1, num_accepted=0, step=step)
    assert stats.rates([0.7], step=5)[0] < 0.3
    assert stats.rates([0.7], step=200)[0] == pytest.approx(0.7, abs=1e-6)


# ---- the decision rule ---------------------------------------------------------------------------


def value(request_gains, cost, lens) -> float:
    """Expected tokens per unit of step cost when request r verifies lens[r] drafts."""
    batch = len(request_gains)
    tokens = batch + sum(sum(g[:k]) for g, k in zip(request_gains, lens, strict=True))
    return tokens / cost(batch, sum(lens) / batch)


def random_gains(rng: random.Random, batch: int, max_len: int) -> list[list[float]]:
    return [
        gains([rng.random() ** 0.5 for _ in range(max_len)], rng.randint(0, max_len))
        for _ in range(batch)
    ]


def test_padded_choice_matches_brute_force():
    rng = random.Random(0)
    cost = StepCost(TABLE)
    for _ in range(300):
        batch = rng.randint(1, 12)
        request_gains = random_gains(rng, batch, 4)
        best = max([0, *LADDER], key=lambda k: padded_value(request_gains, cost, k))
        lens = choose_draft_lens(request_gains, cost, LADDER, padded=True)
        assert lens == [min(best, len(g)) for g in request_gains]


def padded_value(request_gains, cost, k: int) -> float:
    batch = len(request_gains)
    return (batch + sum(sum(g[:k]) for g in request_gains)) / cost(batch, k)


def test_ragged_choice_matches_brute_force():
    rng = random.Random(1)
    cost = StepCost(TABLE)
    for _ in range(200):
        batch = rng.randint(1, 4)
        request_gains = random_gains(rng, batch, 3)
        every = itertools.product(*(range(len(g) + 1) for g in request_gains))
        best = max(value(request_gains, cost, lens) for lens in every)
        lens = choose_draft_lens(request_gains, cost, LADDER, padded=False)
        assert all(0 <= k <= len(g) for k, g in zip(lens, request_gains, strict=True))
        assert value(request_gains, cost, lens) == pytest.approx(best)


def chosen_k(rate: float, batch: int, padded: bool = True) -> int:
    request_gains = [gains([rate] * 4, 4)] * batch
    return max(choose_draft_lens(request_gains, StepCost(DEFAULT_COST_TABLE), LADDER, padded))


def test_high_acceptance_speculates_low_acceptance_and_large_batches_do_not():
    """With the measured H200 gpt-oss-120b costs (a batch-1 step with 1 draft costs 1.24 decode
    steps; 1.71 at batch 8 by the model)."""
    # padded: k of the ladder 1, 2, 4; ragged: any k (k = 3 costs 1.69 steps, k = 4 2.05)
    assert (chosen_k(0.9, batch=1), chosen_k(0.9, batch=1, padded=False)) == (4, 3)
    assert (chosen_k(0.7, batch=1), chosen_k(0.7, batch=1, padded=False)) == (2, 3)
    for padded in (True, False):
        assert chosen_k(0.2, batch=1, padded=padded) == 0
        assert chosen_k(0.7, batch=8, padded=padded) == 0
        assert chosen_k(0.7, batch=32, padded=padded) == 0
        assert chosen_k(0.9, batch=32, padded=padded) == 0
    assert chosen_k(0.95, batch=8) == 2  # a large batch still speculates when it pays


def expected_tokens_per_cost(rate: float, batch: int, k: int) -> float:
    """Tokens a request emits per step over what the step costs: E(k) / cost(batch, k)."""
    return (1 + sum(gains([rate] * k, k))) / StepCost(DEFAULT_COST_TABLE)(batch, k)


@pytest.mark.parametrize("batch", [1, 2, 4, 8, 16, 32, 64])
def test_speculation_is_off_exactly_where_no_k_pays_for_itself(batch):
    """Synthetic acceptance rates 0.05 .. 0.99: a padded batch speculates iff some k of the
    ladder emits more than one token per plain step's worth of cost, and then the best one."""
    for rate in [i / 100 for i in range(5, 100, 2)]:
        value = {k: expected_tokens_per_cost(rate, batch, k) for k in LADDER}
        best = max(value, key=value.get)
        assert chosen_k(rate, batch) == (best if value[best] > 1 else 0), rate


def break_even_rate(batch: int) -> float:
    return next(i / 1000 for i in range(1, 1000) if chosen_k(i / 1000, batch) > 0)


def test_the_acceptance_needed_grows_with_the_batch():
    needed = [break_even_rate(batch) for batch in (1, 2, 4, 8, 16, 32, 64)]
    assert needed == sorted(needed) and len(set(needed)) == len(needed)
    assert needed[0] == pytest.approx(0.24, abs=0.01)  # batch 1: a draft costs 0.24 steps
    assert needed[3] == pytest.approx(0.71, abs=0.01)  # batch 8: more than the 0.7 prior


def test_ngram_at_batch_8_on_mini_turns_down_to_one_draft():
    """The H200 run: ngram at batch 8 emitted 3.75 tokens per 4-draft step (a ~0.85 rate per
    position) and ran at 0.92x. The model agrees that k = 4 loses there and keeps k = 1;
    at batch 32 nothing pays."""
    assert 1 + sum(gains([0.85] * 4, 4)) == pytest.approx(3.75, abs=0.05)
    assert expected_tokens_per_cost(0.85, 8, 4) == pytest.approx(0.92, abs=0.03)
    assert chosen_k(0.85, batch=8) == 1 and chosen_k(0.85, batch=1) == 4
    assert chosen_k(0.85, batch=32) == 0


def test_the_chooser_turns_down_by_batch_on_recorded_drafts():
    """Acceptance learnt from drafts (a seeded 0.85 per position), then the same requests in
    batches of 1, 8 and 32."""
    rng = random.Random(4)
    chooser = DraftLengthChooser(DEFAULT_COST_TABLE, LADDER, num_positions=4, window=8)
    ids = [str(i) for i in range(32)]
    for step in range(1, 41):
        for request_id in ids:
            accepted = next((i for i in range(4) if rng.random() > 0.85), 4)
            chooser.record(request_id, "ngram", drafted=4, accepted=accepted, step=step)

    def k_for(batch: int) -> int:
        wanted = [(request_id, "ngram", 4) for request_id in ids[:batch]]
        return max(chooser.choose(wanted, batch, padded=True, token_budget=8192, step=41))

    assert (k_for(1), k_for(8), k_for(32)) == (4, 1, 0)


def test_the_token_budget_caps_k():
    request_gains = [gains([0.99] * 4, 4)] * 4
    cost = StepCost(((1, ((0, 1.0), (1, 1.0))),))  # verification for free
    assert choose_draft_lens(request_gains, cost, LADDER, padded=True) == [4] * 4
    assert choose_draft_lens(request_gains, cost, LADDER, True, token_budget=12) == [2] * 4
    assert sum(choose_draft_lens(request_gains, cost, LADDER, False, token_budget=9)) == 5


def test_the_chooser_learns_per_request_and_per_method():
    chooser = DraftLengthChooser(DEFAULT_COST_TABLE, LADDER, num_positions=4, window=8)
    alone = dict(num_decodes=1, padded=True, token_budget=8192)
    assert chooser.choose([("a", "ngram", 4)], step=1, **alone) == [2]  # the prior, 0.7
    for step in range(1, 12):
        chooser.record("a", "ngram", drafted=4, accepted=4, step=step)
        chooser.record("b", "ngram", drafted=4, accepted=0, step=step)
        chooser.record("c", "suffix", drafted=4, accepted=4, step=step)
    assert chooser.choose([("a", "ngram", 4)], step=12, **alone) == [4]
    assert chooser.choose([("b", "ngram", 4)], step=12, **alone) == [0]
    assert chooser.choose([("b", "suffix", 4)], step=12, **alone) == [4]  # suffix does well
    # b stops drafting: its own evidence fades toward ngram's rates over all requests (~0.5)
    assert chooser.rates("b", "ngram", step=12)[0] < 0.25
    assert chooser.rates("b", "ngram", step=60)[0] == pytest.approx(
        chooser.rates("new", "ngram", step=60)[0], abs=0.01
    )
    assert chooser.expected_accepted("b", "suffix", 12) > chooser.expected_accepted(
        "b", "ngram", 12
    )
    chooser.forget("a")
    assert "a" not in chooser._requests


# ---- in the engine -------------------------------------------------------------------------------

GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


def requests(count: int, params: SamplingParams = GREEDY):
    return {str(i): (p, params) for i, p in enumerate(repetitive_prompts(count, seed=21))}


def run_auto(target, model_path, count: int, **options):
    """The cost model's own decisions: the measured guard (tests/spec/test_guard.py) would judge
    by the CPU's wall time and could keep speculation off for its own reasons."""
    options = {"measured_guard": False} | options
    spec = SpecConfig(method="auto", model=str(model_path), num_speculative_tokens=4, **options)
    engine = make_engine(target, spec)
    tokens, _, steps = run_engine(engine, requests(count))
    return tokens, steps, engine.stats.spec_stats


def test_auto_speculates_where_it_pays_and_outputs_are_unchanged(target, target_path):
    plain, _, _ = run_engine(make_engine(target, None), requests(1))
    # NOTE: the target drafting for itself takes a target step per draft: charged, that never
    # pays (test_proposer_time_*); free, it shows k growing
    tokens, steps, stats = run_auto(target, target_path, 1, charge_proposer_time=False)
    assert tokens == plain
    # the target drafting for itself: every draft accepted, k grows to the full 4
    assert stats["draft_num_accepted_tokens"] == stats["draft_num_draft_tokens"] > 0
    assert stats["num_draft_tokens"] > 2 * stats["num_drafts"]
    assert steps < GREEDY.max_tokens / 2


def test_auto_stays_off_where_verification_costs_too_much(target, target_path):
    plain, _, _ = run_engine(make_engine(target, None), requests(4))
    expensive = {"1": [1.0, 2.0]}  # each draft costs a whole decode step: never worth it
    tokens, steps, stats = run_auto(target, target_path, 4, cost_table=expensive)
    assert tokens == plain and steps == GREEDY.max_tokens
    assert stats["num_draft_tokens"] == 0 and stats["num_cost_off_steps"] > 0
    # cheap at batch 1, dear at batch 8: eight requests never speculate, one does
    by_batch = {"1": [1.0, 1.05], "8": [1.0, 3.0]}
    _, _, crowd = run_auto(target, target_path, 8, cost_table=by_batch)
    _, _, alone = run_auto(target, target_path, 1, cost_table=by_batch)
    assert crowd["num_draft_tokens"] == 0 and alone["num_draft_tokens"] > 0


def test_a_useless_proposer_is_tried_then_left_off(target, other_model_path):
    """A draft model the target rarely agrees with: a few tries, then the cost model keeps it
    off (the per-request off switch alone would wait for a window of failures)."""
    plain, _, _ = run_engine(make_engine(target, None), requests(1))
    tokens, _, stats = run_auto(target, other_model_path, 1, methods=("draft",))
    assert tokens == plain
    assert stats["num_drafts"] <= 6 and stats["num_cost_off_steps"] >= GREEDY.max_tokens - 8


def test_ragged_cost_aware_steps_give_each_request_its_own_k(target):
    plain, _, _ = run_engine(make_engine(target, None), requests(4))
    table = {"1": [1.0, 1.1, 1.3, 1.6, 2.0]}
    spec = SpecConfig(method="auto", cost_table=table, pad_drafts=False)
    engine = make_engine(target, spec)
    tokens, _, _ = run_engine(engine, requests(4))
    assert tokens == plain
    stats = engine.stats.spec_stats
    assert stats["num_ragged_verify_steps"] > 0 and stats["num_padding_tokens"] == 0


def test_seeded_sampling_is_unchanged_by_the_cost_model(target):
    """A seeded request in speculating batches (its neighbour's drafts pay) draws one race per
    emitted token from its generator, whatever k the cost model picks: the very tokens of plain
    sampling."""
    params = SamplingParams(temperature=0.5, seed=5, max_tokens=24, ignore_eos=True)
    seeded = {"s": (repetitive_prompts(1, seed=8)[0], params)}
    plain, _, _ = run_engine(make_engine(target, None), seeded)
    spec = SpecConfig(method="auto", num_speculative_tokens=4, measured_guard=False)
    engine = make_engine(target, spec)
    tokens, _, _ = run_engine(engine, seeded | requests(1))
    assert tokens[("s", 0)] == plain[("s", 0)]
    stats = engine.stats.spec_stats
    assert stats["num_accepted_tokens"] > 0 and stats["num_padding_tokens"] > 0
