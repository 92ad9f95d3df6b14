"""Speculative decoding in the engine: greedy outputs equal plain decoding token for token with every
proposer (mixed batches, chunked prefill, prefix hits, preemption mid-speculation), seeded sampling
stays reproducible, and the acceptance metrics move."""

from __future__ import annotations

import pytest

from gossamer.engine.core import EngineConfig, EngineCore
from gossamer.sampling_params import SamplingParams
from gossamer.spec.config import SpecConfig
from gossamer.spec.speculator import Speculator
from tests.spec.conftest import (
    FREE_VERIFICATION,
    greedy_requests,
    make_engine,
    prefix_sharing_requests,
    repetitive_prompts,
    run_engine,
)


@pytest.fixture(scope="module")
def plain_greedy(target):
    """Plain decoding of the shared workload (also with a tiny budget: chunked prefill)."""
    tokens, _, _ = run_engine(make_engine(target, None), greedy_requests())
    return tokens


def spec_configs(target_path, other_model_path) -> dict[str, SpecConfig]:
    return {
        "ngram": SpecConfig(method="ngram", num_speculative_tokens=3),
        "suffix": SpecConfig(method="suffix", num_speculative_tokens=4),
        "draft_same": SpecConfig(method="draft", model=str(target_path), num_speculative_tokens=4),
        "draft_other": SpecConfig(
            method="draft", model=str(other_model_path), num_speculative_tokens=2
        ),
        "auto": SpecConfig(
            method="auto",
            model=str(target_path),
            num_speculative_tokens=3,
            cost_table=FREE_VERIFICATION,
        ),
        # a draft pool too small for the batch: draft states are dropped and recomputed
        "draft_tight_pool": SpecConfig(
            method="draft", model=str(target_path), num_speculative_tokens=3, draft_num_blocks=24
        ),
    }


@pytest.mark.parametrize(
    "name", ["ngram", "suffix", "draft_same", "draft_other", "auto", "draft_tight_pool"]
)
def test_greedy_with_chunked_prefill_equals_plain_decoding(
    name, target, target_path, other_model_path, plain_greedy
):
    spec = spec_configs(target_path, other_model_path)[name]
    engine = make_engine(target, spec, max_num_batched_tokens=20, max_num_seqs=6)
    tokens, _, _ = run_engine(engine, greedy_requests())
    assert tokens == plain_greedy
    stats = engine.stats.spec_stats
    assert stats["num_draft_tokens"] > 0
    assert engine.stats.generation_tokens == sum(len(t) for t in tokens.values())
    if name != "draft_other":
        assert stats["num_accepted_tokens"] > 0
        assert stats["mean_accepted_length"] > 1


def test_acceptance_metrics_and_fewer_steps(target, target_path):
    requests = greedy_requests(4, seed=3)
    _, _, plain_steps = run_engine(make_engine(target, None), requests)
    spec = SpecConfig(method="draft", model=str(target_path), num_speculative_tokens=4)
    engine = make_engine(target, spec)
    _, _, steps = run_engine(engine, requests)
    stats = engine.stats.spec_stats
    # the target drafting for itself: every draft accepted, about five tokens per step
    assert stats["acceptance_rate"] == 1.0
    assert stats["acceptance_rate_pos_0"] == stats["acceptance_rate_pos_3"] == 1.0
    assert steps < plain_steps / 2
    assert stats["draft_num_drafts"] == stats["num_drafts"]


def test_low_acceptance_switches_a_request_off(target, other_model_path):
    spec = SpecConfig(
        method="draft",
        model=str(other_model_path),
        num_speculative_tokens=2,
        acceptance_window=4,
        min_acceptance_rate=0.5,
        retry_after=8,
    )
    engine = make_engine(target, spec)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    run_engine(engine, {"a": (repetitive_prompts(1)[0], params)})
    stats = engine.stats.spec_stats
    assert stats["num_disabled_requests"] >= 1
    assert stats["num_drafts"] < 30  # proposals stopped for most of the 40 steps


def test_large_batches_do_not_speculate(target):
    spec = SpecConfig(method="ngram", disable_by_batch_size=3)
    engine = make_engine(target, spec)
    tokens, _, _ = run_engine(engine, greedy_requests(4))
    stats = engine.stats.spec_stats
    assert stats["num_disabled_steps"] > 0
    plain, _, _ = run_engine(make_engine(target, None), greedy_requests(4))
    assert tokens == plain


def test_prefix_hits_and_preemption_mid_speculation(target, target_path):
    requests = prefix_sharing_requests()
    plain, _, _ = run_engine(make_engine(target, None), requests)
    for spec in (
        SpecConfig(method="ngram", num_speculative_tokens=4),
        SpecConfig(method="draft", model=str(target_path), num_speculative_tokens=4),
        SpecConfig(  # tree drafts (tests/spec/test_engine_tree.py has more)
            method="draft",
            model=str(target_path),
            num_speculative_tokens=3,
            tree={"branching": [3, 2, 1]},
        ),
    ):
        engine = make_engine(target, spec, num_blocks=48, max_num_batched_tokens=32)
        tokens, _, _ = run_engine(engine, requests)
        assert tokens == plain
        assert engine.stats.num_preemptions > 0
        assert engine.stats.prefix_cache_hits > 0
        assert engine.stats.spec_stats["num_accepted_tokens"] > 0
        assert engine.kv_cache_manager.num_free_blocks == 47  # every block back, null excepted


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_seeded_sampling_with_point_mass_drafts_equals_plain_sampling(target, method):
    """One race draw per emitted token from the request's generator: the same tokens as without
    speculation, alone or in a batch, n > 1 included."""
    params = SamplingParams(n=2, temperature=0.3, seed=11, max_tokens=30, ignore_eos=True)
    requests = {"s": (repetitive_prompts(1, seed=8)[0], params)}
    others = greedy_requests(3, seed=9)
    plain, _, _ = run_engine(make_engine(target, None), requests)
    engine = make_engine(target, SpecConfig(method=method, num_speculative_tokens=3))
    crowd, _, _ = run_engine(engine, requests | others)
    assert crowd[("s", 0)] == plain[("s", 0)] and crowd[("s", 1)] == plain[("s", 1)]
    assert engine.stats.spec_stats["num_accepted_tokens"] > 0


def test_seeded_sampling_with_a_draft_model_is_reproducible(target, target_path, other_model_path):
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=16, ignore_eos=True)
    prompt = repetitive_prompts(1, seed=10)[0]
    for path in (target_path, other_model_path):
        spec = SpecConfig(method="draft", model=str(path), num_speculative_tokens=3)
        alone, _, _ = run_engine(make_engine(target, spec), {"s": (prompt, params)})
        engine = make_engine(target, spec, max_num_batched_tokens=16)
        crowd, _, _ = run_engine(engine, {"s": (prompt, params)} | greedy_requests(3, seed=2))
        assert crowd[("s", 0)] == alone[("s", 0)]
    # the target drafting for itself at temperature 1: p == q, so every draft is accepted
    same = SpecConfig(method="draft", model=str(target_path), num_speculative_tokens=3)
    engine = make_engine(target, same)
    run_engine(engine, {"s": (prompt, params)})
    assert engine.stats.spec_stats["acceptance_rate"] == 1.0


def test_logprobs_stop_tokens_and_max_tokens_match_plain_decoding(target, target_path):
    prompts = repetitive_prompts(3, seed=12)
    plain_params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=2)
    reference, _, _ = run_engine(make_engine(target, None), {"x": (prompts[0], plain_params)})
    stop = reference[("x", 0)][7]  # a token the output reaches after several steps
    params = SamplingParams(temperature=0, max_tokens=19, logprobs=2, stop_token_ids=(stop,))
    requests = {str(i): (p, params) for i, p in enumerate(prompts)}
    plain, plain_logprobs, _ = run_engine(make_engine(target, None), requests)
    spec = SpecConfig(method="draft", model=str(target_path), num_speculative_tokens=4)
    tokens, logprobs, _ = run_engine(make_engine(target, spec), requests)
    assert tokens == plain
    assert tokens[("0", 0)][-1] == stop
    for key, values in logprobs.items():
        assert [lp.token_id for lp in values] == tokens[key]
        for got, want in zip(values, plain_logprobs[key], strict=True):
            assert got.logprob == pytest.approx(want.logprob, abs=1e-4)
            assert [t for t, _ in got.top] == [t for t, _ in want.top]


def test_a_stop_string_inside_accepted_drafts_ends_where_plain_decoding_ends(
    target, target_path, harmony_tokenizer
):
    def generate(spec, stop=()):
        engine = EngineCore(
            target,
            harmony_tokenizer,
            EngineConfig(block_size=4, num_blocks=400, speculative_config=spec),
        )
        params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=stop)
        engine.add_request("x", repetitive_prompts(1, seed=13)[0], params)
        tokens, text, last = [], "", None
        while engine.has_unfinished_requests():
            for out in engine.step():
                tokens += out.new_token_ids
                text += out.text_delta
                last = out
        summary = (tokens, text, last.finish_reason, last.stop_reason, last.num_output_tokens)
        return summary, engine.stats.generation_tokens

    (_, text, *_), _ = generate(None)
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    plain, _ = generate(None, (stop,))
    assert plain[2] == "stop" and plain[3] == stop
    spec = SpecConfig(method="draft", model=str(target_path), num_speculative_tokens=5)
    speculative, generated = generate(spec, (stop,))
    assert speculative == plain
    assert generated > len(plain[0])  # the step that found the stop had accepted more tokens


def _released_with_a_returning_id(target):
    """(proposer releases in order as (id, tokens), each id's final tokens per request): "a" and
    "b" run; as "a" ends, "c" joins and "a" comes back as a new request."""
    engine = make_engine(target, SpecConfig(method="ngram", num_speculative_tokens=2))
    speculator = engine.speculator
    released = []
    real = speculator.proposers["ngram"].release

    def recording(request_id, token_ids, num_prompt_tokens):
        released.append((request_id, list(token_ids)))
        real(request_id, token_ids, num_prompt_tokens)

    speculator.proposers["ngram"].release = recording
    prompts = repetitive_prompts(3, seed=11)
    params = {n: SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (3, 20)}
    engine.add_request("a", prompts[0], params[3])
    engine.add_request("b", prompts[1], params[20])
    finals: dict[str, list[list[int]]] = {}
    outputs: dict[str, list[int]] = {"a": list(prompts[0]), "b": list(prompts[1])}
    added = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id].extend(out.new_token_ids)
            if out.finished:
                finals.setdefault(out.request_id, []).append(outputs.pop(out.request_id))
        if "a" in finals and not added:  # joins as "a" ends; then "a" again, a new request
            engine.add_request("c", prompts[2], params[3])
            engine.add_request("a", prompts[2][::-1], params[3])
            outputs["c"], outputs["a"] = list(prompts[2]), list(prompts[2][::-1])
            added.append(True)
    engine.step()  # after the last finish: one more step's bookkeeping (no requests)
    return released, finals


@pytest.mark.parametrize("look_for_ended", [True, False])
def test_every_request_is_released_once_with_its_own_tokens(target, monkeypatch, look_for_ended):
    """The speculator lets proposers go of a request when it ends: a request that ends while
    another joins, and an id that comes back after its request ended, are each released once,
    with that request's own final tokens. Without the search for ended requests (which runs only
    when the tracked outnumber the running), the returning id alone releases its predecessor."""
    if not look_for_ended:
        monkeypatch.setattr(Speculator, "_release_ended", lambda self, scheduler: None)
    released, finals = _released_with_a_returning_id(target)
    first_a = next(tokens for request_id, tokens in released if request_id == "a")
    assert first_a == finals["a"][0]
    if look_for_ended:
        assert sorted(request_id for request_id, _ in released) == ["a", "a", "b", "c"]
        assert [tokens for request_id, tokens in released if request_id == "a"] == finals["a"]
    else:
        assert [request_id for request_id, _ in released] == ["a"]
