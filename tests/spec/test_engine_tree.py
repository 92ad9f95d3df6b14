"""Tree drafts in the engine: greedy outputs equal plain decoding token for token (draft model and
EAGLE-3, next to requests that do not speculate, with chunked prefill; prefix hits and preemption
are in test_engine_spec.py), seeded sampling yields the very tokens of plain sampling, and the
stats count nodes and depths."""

from __future__ import annotations

import pytest

from gossamer.sampling_params import SamplingParams
from gossamer.spec.config import SpecConfig, SpecConfigError
from tests.spec.conftest import make_engine, repetitive_prompts, run_engine

GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
TREE = {"branching": [3, 2, 1]}  # 3 + 6 + 6 = 15 nodes, depth 3


def workload(seed: int = 0) -> dict:
    """Greedy requests, a sampled one and two that never speculate (max_tokens 1 leaves no room
    for a draft; a short one speculates at most once)."""
    prompts = repetitive_prompts(6, seed)
    requests = {str(i): (p, GREEDY) for i, p in enumerate(prompts[:4])}
    requests["sampled"] = (prompts[4], SamplingParams(temperature=0.7, seed=5, max_tokens=16))
    requests["one"] = (prompts[5], SamplingParams(temperature=0, max_tokens=1))
    requests["short"] = (prompts[0][:5], SamplingParams(temperature=0, max_tokens=3))
    return requests


@pytest.fixture(scope="module")
def plain(target):
    return run_engine(make_engine(target, None), workload())[0]


def draft_tree(path, **options) -> SpecConfig:
    return SpecConfig(
        method="draft", model=str(path), num_speculative_tokens=3, tree=TREE, **options
    )


@pytest.mark.parametrize("draft", ["same", "other"])
def test_greedy_and_seeded_tree_speculation_equal_plain_decoding(
    draft, target, target_path, other_model_path, plain
):
    """Chunked prefill (a budget of 20 tokens) next to 16-token tree steps; the seeded request
    draws the tokens plain sampling draws (one race per emitted token)."""
    path = target_path if draft == "same" else other_model_path
    engine = make_engine(target, draft_tree(path), max_num_batched_tokens=20)
    tokens, _, _ = run_engine(engine, workload())
    assert tokens == plain
    stats = engine.stats.spec_stats
    assert stats["num_tree_drafts"] == stats["num_drafts"] > 0
    assert stats["num_tree_verify_steps"] > 0
    assert stats["num_draft_tokens"] > 2 * stats["num_draft_positions"]  # nodes vs depths
    assert engine.stats.generation_tokens == sum(len(t) for t in tokens.values())
    if draft == "same":
        assert stats["mean_accepted_length"] > 2.5


def test_logprobs_match_plain_decoding_with_trees(target, target_path):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    requests = {str(i): (p, params) for i, p in enumerate(repetitive_prompts(2, seed=12))}
    plain_tokens, plain_logprobs, _ = run_engine(make_engine(target, None), requests)
    engine = make_engine(target, draft_tree(target_path))
    tokens, logprobs, _ = run_engine(engine, requests)
    assert tokens == plain_tokens
    stats = engine.stats.spec_stats  # the target drafting for itself: every path to its end
    assert stats["num_accepted_tokens"] == stats["num_draft_positions"] > 0
    assert stats["acceptance_rate_pos_2"] == 1.0
    assert stats["acceptance_rate"] == stats["num_accepted_tokens"] / stats["num_draft_tokens"]
    for key, values in logprobs.items():
        for got, want in zip(values, plain_logprobs[key], strict=True):
            assert got.token_id == want.token_id
            assert got.logprob == pytest.approx(want.logprob, abs=1e-4)


def test_a_tree_larger_than_the_token_budget_is_refused(target, target_path):
    with pytest.raises(SpecConfigError, match="max_num_batched_tokens"):
        make_engine(target, draft_tree(target_path), max_num_batched_tokens=12)
