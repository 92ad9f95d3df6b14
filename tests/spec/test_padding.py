"""Padded drafts: verification steps whose proposers return drafts of different lengths (or none)
reach the runner in one uniform (batch, 1 + k) shape that a CUDA graph can replay, the filler is
never accepted, greedy outputs stay those of plain decoding, and the budget, the KV pool and
preemption behave."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from gossamer.runner.model_runner import SeqInput, uniform_query_len
from gossamer.runner.sampler import SamplingRow
from gossamer.sampling_params import SamplingParams
from gossamer.scheduler import ScheduledRequest
from gossamer.spec.config import SpecConfig
from gossamer.spec.ngram import NgramProposer
from gossamer.spec.proposer import Draft
from gossamer.spec.speculator import Speculator
from tests.spec.conftest import (
    FREE_VERIFICATION,
    GREEDY,
    greedy_requests,
    make_engine,
    prefix_sharing_requests,
    repetitive_prompts,
    run_engine,
)


def record_shapes(engine) -> list[list[tuple[int, int]]]:
    """Wrap the engine's runner: the (tokens fed, logits wanted) of each sequence, per step."""
    steps: list[list[tuple[int, int]]] = []
    run = engine.runner.run

    def recording_run(seqs):
        steps.append([(len(seq.token_ids), seq.num_logits) for seq in seqs])
        return run(seqs)

    engine.runner.run = recording_run
    return steps


def verification_steps(steps):
    """The decode-only steps that verify drafts (more than one logit for some sequence)."""
    return [s for s in steps if any(n > 1 for _, n in s) and all(q == n for q, n in s)]


@pytest.mark.parametrize("method", ["ngram", "suffix", "auto"])
def test_mixed_draft_lengths_reach_the_runner_as_uniform_steps(target, method):
    requests = greedy_requests()
    plain, _, _ = run_engine(make_engine(target, None), requests)
    spec = SpecConfig(method=method, cost_table=FREE_VERIFICATION)
    ragged_engine = make_engine(target, replace(spec, pad_drafts=False))
    ragged_shapes = record_shapes(ragged_engine)
    ragged, _, _ = run_engine(ragged_engine, requests)
    # without padding the proposers' drafts differ in length: the workload is a real test
    assert ragged_engine.stats.spec_stats["num_ragged_verify_steps"] > 0
    assert any(len({q for q, _ in s}) > 1 for s in verification_steps(ragged_shapes))

    engine = make_engine(target, spec)
    shapes = record_shapes(engine)
    tokens, _, _ = run_engine(engine, requests)
    assert tokens == plain == ragged
    stats = engine.stats.spec_stats
    assert stats["num_ragged_verify_steps"] == 0
    assert stats["num_uniform_verify_steps"] > 0 and stats["num_padding_tokens"] > 0
    checked = verification_steps(shapes)
    assert len(checked) == stats["num_uniform_verify_steps"]
    for step in checked:
        (q,) = {q for q, _ in step}
        assert q - 1 in spec.draft_len_ladder


def test_the_filler_is_never_accepted():
    """The filler tokens equal the target's argmax, so verifying them would accept them: only the
    real drafts count, and a request padded from nothing gets exactly one token."""
    speculator = Speculator(SpecConfig(method="ngram"), {"ngram": NgramProposer(4)})
    vocab, filler, pending, draft = 16, 9, 3, 5
    speculator._pending["a"] = ("ngram", Draft([draft]))
    items = [
        scheduled("a", [pending, draft, filler, filler], num_drafts=3),
        scheduled("b", [pending, filler, filler, filler], num_drafts=3),
    ]
    # argmax per row: a: draft, filler, filler, 1; b: 2, filler, filler, filler
    argmax = [draft, filler, filler, 1, 2, filler, filler, filler]
    logits = torch.nn.functional.one_hot(torch.tensor(argmax), vocab).float()
    row = SamplingRow(GREEDY, [pending], [], None)
    tokens, _ = speculator.sample(logits, items, [row, row], torch.Generator())
    assert tokens == [[draft, filler], [2]]
    assert speculator.metrics.num_padding_tokens == 2 + 3


def scheduled(request_id: str, token_ids: list[int], num_drafts: int) -> ScheduledRequest:
    ids = ((),)
    n = len(token_ids)
    return ScheduledRequest(request_id, token_ids, 10, n, num_drafts, True, False, 0, ids, 2, None)


def test_padding_skips_steps_that_cannot_be_uniform_and_respects_the_budget(target):
    """A budget too small for the padded batch: no padding (the scheduler would cut it), every
    step within the budget, outputs unchanged."""
    requests = greedy_requests(6, seed=2)
    plain, _, _ = run_engine(make_engine(target, None), requests)
    engine = make_engine(target, SpecConfig(method="ngram"), max_num_batched_tokens=14)
    shapes = record_shapes(engine)
    tokens, _, _ = run_engine(engine, requests)
    assert tokens == plain
    assert all(sum(q for q, _ in step) <= 14 for step in shapes)
    # a ragged step is one whose padding would not have fit: its longest draft rounded up to the
    # ladder, times the batch, exceeds the budget
    ladder = SpecConfig(method="ngram").draft_len_ladder
    ragged = [s for s in verification_steps(shapes) if uniform_query_len_of(s) is None]
    assert ragged
    for step in ragged:
        padded = next(k for k in ladder if k >= max(q for q, _ in step) - 1)
        assert len(step) * (1 + padded) > 14


def uniform_query_len_of(step: list[tuple[int, int]]) -> int | None:
    return uniform_query_len([SeqInput([0] * q, 0, (), n) for q, n in step])


def test_padding_under_kv_pressure_preempts_and_rolls_every_slot_back(target, target_path):
    requests = prefix_sharing_requests()
    plain, _, _ = run_engine(make_engine(target, None), requests)
    for spec in (
        SpecConfig(method="suffix", num_speculative_tokens=8),
        SpecConfig(
            method="auto",
            model=str(target_path),
            num_speculative_tokens=4,
            cost_table=FREE_VERIFICATION,
        ),
    ):
        engine = make_engine(target, spec, num_blocks=40, max_num_batched_tokens=48)
        tokens, _, _ = run_engine(engine, requests)
        assert tokens == plain
        assert engine.stats.num_preemptions > 0
        assert engine.stats.spec_stats["num_padding_tokens"] > 0
        assert engine.kv_cache_manager.num_free_blocks == 39  # every block back, null excepted


def test_padding_near_the_context_limit_matches_plain_decoding(target):
    """Requests that run into max_model_len (256 here): the scheduler cuts drafts and filler that
    would pass the context, never a real token."""
    params = SamplingParams(temperature=0, max_tokens=None, ignore_eos=True)
    prompts = repetitive_prompts(3, seed=7)
    requests = {str(i): ((p * 40)[: 240 + i], params) for i, p in enumerate(prompts)}
    plain, _, _ = run_engine(make_engine(target, None), requests)
    engine = make_engine(target, SpecConfig(method="ngram", num_speculative_tokens=4))
    tokens, _, _ = run_engine(engine, requests)
    assert tokens == plain
    for (request_id, _), output in tokens.items():
        assert len(requests[request_id][0]) + len(output) == 256
    assert engine.stats.spec_stats["num_padding_tokens"] > 0
