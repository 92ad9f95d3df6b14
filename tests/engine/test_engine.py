"""The batching engine against the single-sequence reference: batch invariance, prefix caching,
preemption, sliding-window memory, seeds, n > 1 and abort."""

from __future__ import annotations

import pytest
import torch

from gossamer.engine.core import EngineConfig, EngineCore
from gossamer.engine.errors import PromptTooLongError, RequestError
from gossamer.engine.reference import ContiguousCache, forward_tokens, generate_stream
from gossamer.model.loader import load_model
from gossamer.sampling_params import SamplingParams
from tests.hf_models import write_hf_model

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_hf_model(tmp_path_factory.mktemp("engine"), seed=31, num_hidden_layers=2)
    return load_model(str(path), dtype="float32", max_model_len=256).model


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 40, (count,), generator=gen).tolist()
    return [torch.randint(0, 320, (n,), generator=gen).tolist() for n in lengths]


def run_all(engine: EngineCore, requests: dict[str, tuple[list[int], SamplingParams]]):
    for request_id, (prompt, params) in requests.items():
        engine.add_request(request_id, prompt, params)
    tokens = {(rid, i): [] for rid, (_, p) in requests.items() for i in range(p.n)}
    finish = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[(out.request_id, out.index)] += out.new_token_ids
            if out.finished:
                finish[(out.request_id, out.index)] = out.finish_reason
    return tokens, finish


def engine_for(model, **options) -> EngineCore:
    config = EngineConfig(**({"block_size": 4, "num_blocks": 400} | options))
    return EngineCore(model, None, config)


def test_batch_of_16_with_chunked_prefill_equals_each_alone_and_the_reference(model):
    batch = prompts(16)
    engine = engine_for(model, max_num_batched_tokens=24, max_num_seqs=16)
    together, _ = run_all(engine, {str(i): (p, GREEDY) for i, p in enumerate(batch)})
    for i, prompt in enumerate(batch):
        alone, _ = run_all(engine_for(model), {"x": (prompt, GREEDY)})
        reference = list(generate_stream(model, prompt, 12))
        assert together[(str(i), 0)] == alone[("x", 0)] == reference


def test_prefix_hit_reuses_blocks_and_keeps_the_output(model):
    shared = prompts(1, seed=3)[0] * 2  # ~40-80 tokens
    first, second = shared + [5, 6, 7], shared + [9, 10]
    engine = engine_for(model)
    run_all(engine, {"a": (first, GREEDY)})
    before = engine.kv_cache_manager.prefix_cache_stats.num_hit_tokens
    hit, _ = run_all(engine, {"b": (second, GREEDY)})
    hit_tokens = engine.kv_cache_manager.prefix_cache_stats.num_hit_tokens - before
    assert hit_tokens >= len(shared) - 4  # all full blocks of the shared prefix
    assert engine.stats.prompt_tokens == len(first) + len(second) - hit_tokens
    cold, _ = run_all(engine_for(model, enable_prefix_caching=False), {"b": (second, GREEDY)})
    assert hit == cold


def test_preemption_under_a_tiny_kv_budget_keeps_every_output(model):
    batch = prompts(6, seed=5)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    requests = {str(i): (p, params) for i, p in enumerate(batch)}
    roomy, _ = run_all(engine_for(model), requests)
    tight_engine = engine_for(model, num_blocks=40)  # ~4 requests' worth of blocks
    tight, finish = run_all(tight_engine, requests)
    assert tight_engine.stats.num_preemptions > 0
    assert tight == roomy
    assert set(finish.values()) == {"length"}
    assert tight_engine.kv_cache_manager.num_free_blocks == 39  # all but the null block


def test_sliding_group_holds_a_bounded_number_of_blocks(model):
    engine = engine_for(model)
    engine.add_request(
        "long", prompts(1)[0], SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)
    )
    window_blocks = model.config.sliding_window // 4 + 1
    full_counts, sliding_counts = [], []
    while engine.has_unfinished_requests():
        engine.step()
        if engine.kv_cache_manager.has_request("long"):
            full, sliding = engine.kv_cache_manager.num_held_blocks("long")
            full_counts.append(full)
            sliding_counts.append(sliding)
    # the prefill step holds the whole chunk; from the first decode on, only the window
    assert max(sliding_counts[1:]) <= window_blocks + 1
    assert full_counts[-1] > 20  # the full group keeps growing with the sequence


def test_seeded_sampling_is_the_same_alone_and_in_a_batch(model):
    seeded = SamplingParams(temperature=1.0, seed=42, max_tokens=10, ignore_eos=True)
    prompt = prompts(1, seed=8)[0]
    alone, _ = run_all(engine_for(model), {"s": (prompt, seeded)})
    noisy = SamplingParams(temperature=1.3, max_tokens=7, ignore_eos=True)
    others = {str(i): (p, noisy) for i, p in enumerate(prompts(5, seed=9))}
    crowd, _ = run_all(
        engine_for(model, max_num_batched_tokens=16), others | {"s": (prompt, seeded)}
    )
    assert crowd[("s", 0)] == alone[("s", 0)]


def test_n_choices_share_the_prompt_blocks_and_differ(model):
    prompt = prompts(1, seed=10)[0] * 3
    params = SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=8, ignore_eos=True)
    engine = engine_for(model)
    tokens, finish = run_all(engine, {"n": (prompt, params)})
    outs = [tokens[("n", i)] for i in range(3)]
    assert all(len(o) == 8 for o in outs) and len({tuple(o) for o in outs}) > 1
    # children forked the parent's blocks instead of recomputing the prompt
    assert engine.stats.prompt_tokens < 2 * len(prompt)
    assert len(finish) == 3


def test_abort_frees_blocks_at_once(model):
    engine = engine_for(model)
    engine.add_request("a", prompts(1)[0], SamplingParams(max_tokens=50, ignore_eos=True))
    engine.add_request("w", prompts(1, seed=2)[0], SamplingParams(max_tokens=50))
    engine.step()
    assert engine.kv_cache_manager.num_free_blocks < 399
    outputs = engine.abort("a") + engine.abort("w")
    assert [o.finish_reason for o in outputs] == ["abort", "abort"]
    assert engine.kv_cache_manager.num_free_blocks == 399
    assert not engine.has_unfinished_requests()


def test_bad_requests_raise_typed_errors(model):
    engine = engine_for(model)
    with pytest.raises(PromptTooLongError):
        engine.add_request("long", [1] * 300, GREEDY)
    with pytest.raises(PromptTooLongError):
        engine.add_request("long", [1] * 200, SamplingParams(max_tokens=100))
    with pytest.raises(RequestError):
        engine.add_request("oov", [1, 999], GREEDY)
    engine.add_request("dup", [1, 2], GREEDY)
    with pytest.raises(RequestError):
        engine.add_request("dup", [1, 2], GREEDY)
    too_big = engine_for(model, num_blocks=5)
    with pytest.raises(RequestError):
        too_big.add_request("huge", [1] * 100, GREEDY)


def _greedy_over_fp8_cache(model, prompt: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
    """The single-sequence reference over an fp8 copy of its cache: (greedy tokens, the prompt's
    last logits)."""
    cache = ContiguousCache(model, len(prompt) + steps)
    cache.kv_cache = cache.kv_cache.to(torch.float8_e4m3fn)
    logits = forward_tokens(model, cache, prompt, 0)[-1]
    first_logits, tokens = logits, []
    for _ in range(steps):
        tokens.append(int(logits.argmax()))
        logits = forward_tokens(model, cache, tokens[-1:], len(prompt) + len(tokens) - 1)[-1]
    return tokens, first_logits


def test_fp8_kv_cache_holds_more_blocks_and_batches_as_the_fp8_reference(model):
    memory = 4 << 20
    exact = EngineCore(model, None, EngineConfig(block_size=4, kv_cache_memory=memory))
    engine = engine_for(model, num_blocks=None, kv_cache_memory=memory, kv_cache_dtype="fp8",
                        max_num_batched_tokens=24, max_num_seqs=8)  # fmt: skip
    assert engine.runner.kv_cache.dtype == torch.float8_e4m3fn
    assert engine.num_blocks == exact.num_blocks * model.dtype.itemsize  # fp32 model: 4x
    batch = prompts(8, seed=5)
    together, _ = run_all(engine, {str(i): (p, GREEDY) for i, p in enumerate(batch)})
    for i, prompt in enumerate(batch):
        tokens, logits = _greedy_over_fp8_cache(model, prompt, 12)
        assert together[(str(i), 0)] == tokens
        # e4m3 rounding moves the logits a little, not nothing
        exact_logits = forward_tokens(model, ContiguousCache(model, len(prompt)), prompt, 0)[-1]
        assert not torch.equal(logits, exact_logits)
        torch.testing.assert_close(logits, exact_logits, atol=0.05, rtol=0.05)


def test_unknown_kv_cache_dtype_is_a_clear_error(model):
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, fp8, fp8_e4m3"):
        engine_for(model, kv_cache_dtype="int4")


def test_kv_cache_dtype_flag():
    import argparse

    from gossamer.engine.args import add_engine_arguments, engine_config_from_args

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert engine_config_from_args(parser.parse_args([])).kv_cache_dtype == "auto"
    config = engine_config_from_args(parser.parse_args(["--kv-cache-dtype", "fp8"]))
    assert config.kv_cache_dtype == "fp8"
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "int8"])
