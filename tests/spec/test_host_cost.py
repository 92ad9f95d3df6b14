"""The speculative step's host-side shortcuts give what the long way gives: verification that reads
a padded step's rows by index, position rows shared where nothing reads the drafts, the chooser's
per-step caches of rates and gains, the memoized step costs, and the runner's short-span slots."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from gossamer.engine.core import BlockTables
from gossamer.runner.model_runner import _short_span_slots
from gossamer.runner.sampler import SamplingRow
from gossamer.sampling_params import SamplingParams
from gossamer.spec.cost import DEFAULT_COST_TABLE, DraftLengthChooser, StepCost, gains
from gossamer.spec.verify import position_rows, verify

GREEDY = SamplingParams(temperature=0)
PARAMS = {
    "greedy": GREEDY,
    "greedy logprobs": SamplingParams(temperature=0, logprobs=2),
    "penalties": SamplingParams(temperature=0, repetition_penalty=1.5, min_tokens=4),
    "random": SamplingParams(temperature=0.9, top_k=5),
}


def _row(params: SamplingParams, output: list[int], seed: int | None = None) -> SamplingRow:
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    return SamplingRow(params, [1, 2, 3], list(output), generator, (0,))


@pytest.mark.parametrize("kind", sorted(PARAMS))
def test_verify_by_row_index_equals_verify_of_the_gathered_rows(kind):
    """A padded step: each request's 1 + k rows, then filler rows, whose logits never count."""
    vocab, k = 9, 4
    gen = torch.Generator().manual_seed(3)
    for trial in range(20):
        lengths = [trial % 5, 2, 0, 4]  # real drafts per request; each is padded to k
        logits = torch.randn(len(lengths) * (k + 1), vocab, generator=gen)
        rows_of, drafts, kept = [], [], []
        for r, length in enumerate(lengths):
            first = r * (k + 1)
            argmax = logits[first : first + length].argmax(dim=-1).tolist()
            drafts.append(argmax[: length // 2] + [(t + 1) % vocab for t in argmax[length // 2 :]])
            kept.extend(range(first, first + length + 1))
            rows_of.append(lambda seed=trial * 10 + r: _row(PARAMS[kind], [5, 6], seed))
        probs = [None] * len(lengths)
        by_index = verify(
            logits, [make() for make in rows_of], drafts, probs, torch.Generator(), None, kept
        )
        gathered = verify(
            logits[torch.tensor(kept)],
            [make() for make in rows_of],
            drafts,
            probs,
            torch.Generator(),
        )
        assert by_index.tokens == gathered.tokens and by_index.paths == gathered.paths
        assert by_index.logprobs == gathered.logprobs


def test_verify_names_a_row_for_every_position():
    logits = torch.zeros(6, 4)
    with pytest.raises(ValueError, match="3 logits rows named for 2 positions"):
        verify(logits, [_row(GREEDY, [])], [[1]], [None], torch.Generator(), None, [0, 1, 2])


def test_position_rows_are_shared_only_where_no_processing_reads_the_output():
    plain = _row(GREEDY, [7, 8])
    assert all(row is plain for row in position_rows(plain, [1, 2, 3]))
    past_min = _row(SamplingParams(temperature=0, min_tokens=2), [7, 8])
    assert all(row is past_min for row in position_rows(past_min, [1, 2]))
    for params in (PARAMS["penalties"], SamplingParams(temperature=0, min_tokens=3)):
        rows = position_rows(_row(params, [7, 8]), [1, 2])
        assert [list(row.output_token_ids) for row in rows] == [[7, 8], [7, 8, 1], [7, 8, 1, 2]]


def test_the_chooser_caches_answer_as_a_fresh_chooser_does():
    """One chooser is asked before and after every record (so its caches are warm when a record
    lands, within the same step); its twin gets the same records and is only asked at the end of
    each step. They must agree to the bit."""
    rng = random.Random(4)
    asked = DraftLengthChooser(DEFAULT_COST_TABLE, (1, 2, 4), num_positions=4, window=8)
    twin = DraftLengthChooser(DEFAULT_COST_TABLE, (1, 2, 4), num_positions=4, window=8)
    requests, methods = ["a", "b", "c"], ["ngram", "suffix"]
    for step in range(1, 60):
        for _ in range(rng.randint(0, 4)):
            request, method = rng.choice(requests), rng.choice(methods)
            asked.expected_accepted(request, method, step)
            drafted = rng.randint(1, 4)
            accepted = rng.randint(0, drafted)
            for chooser in (asked, twin):
                chooser.record(request, method, drafted, accepted, step)
            asked.rates(request, method, step)
        if rng.random() < 0.1:
            asked.rates("b", "ngram", step)
            asked.forget("b")
            twin.forget("b")
        wanted = [(r, rng.choice(methods), rng.randint(1, 4)) for r in requests]
        for request in requests:
            for method in methods:
                assert asked.rates(request, method, step) == twin.rates(request, method, step)
                assert asked.expected_accepted(request, method, step) == sum(
                    gains(twin.rates(request, method, step), 4)
                )
        assert asked.best_rates(step) == twin.best_rates(step)
        for padded in (True, False):
            options = dict(num_decodes=4, padded=padded, token_budget=64, step=step)
            assert asked.choose(wanted, **options) == twin.choose(wanted, **options)


def test_step_costs_are_remembered_not_changed():
    cost = StepCost(((1, ((0, 1.0), (1, 1.3), (4, 2.0))), (8, ((0, 1.0), (1, 1.5), (4, 2.9)))))
    for batch in (1, 3, 8, 17, 64):
        for k in (0.5, 1, 1.25, 2, 4, 6):
            assert cost(batch, k) == cost._cost(batch, k) == cost(batch, k)
    assert StepCost(DEFAULT_COST_TABLE)(1, 0) == 1.0


def test_short_span_slots_follow_the_block_table():
    rng = random.Random(1)
    block_size = 16
    for _ in range(500):
        table = np.array(rng.sample(range(1, 500), 12), dtype=np.int32)
        n = rng.randint(2, block_size)
        start = rng.randrange(0, 12 * block_size - n)
        expected = [
            int(table[p // block_size]) * block_size + p % block_size
            for p in range(start, start + n)
        ]
        assert list(_short_span_slots(table, start, start + n, block_size)) == expected
        assert list(_short_span_slots(list(table), start, start + n, block_size)) == expected


def test_block_table_views_show_blocks_added_later():
    tables = BlockTables(num_groups=2, max_blocks=8)
    tables.apply(0, ((5, 6), (7,)))
    first = tables.views(2)
    tables.apply(1, ((), (9,)))
    assert [view.tolist() for view in tables.views(2)] == [[5, 6], [7, 9]]
    assert tables.views(2) is first  # the same views: no new arrays per step
    tables.apply(2, ((11,), (12,)))
    assert [view.tolist() for view in tables.views(3)] == [[5, 6, 11], [7, 9, 12]]
