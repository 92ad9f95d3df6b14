"""Overlapped scheduling (EngineConfig.async_scheduling, gossamer/engine/overlap.py): every output
equals the synchronous engine's, token for token, and the KV blocks all come back."""

from __future__ import annotations

import asyncio
import time

import pytest

from gossamer.engine.async_engine import AsyncEngine
from gossamer.engine.core import EngineConfig, EngineCore
from gossamer.engine.llm import LLM
from gossamer.model.loader import load_model
from gossamer.models import default_model_path
from gossamer.runner import model_runner
from gossamer.runner.model_runner import GRAPH, EagerGraphCapture
from gossamer.sampling_params import SamplingParams
from tests.engine.test_engine import prompts, run_all
from tests.hf_models import write_hf_model

NUM_BLOCKS = 400


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_hf_model(tmp_path_factory.mktemp("overlap"), seed=37, num_hidden_layers=2)
    return load_model(str(path), dtype="float32", max_model_len=256).model


def engine_for(model, overlap: bool, graphs: bool = False, **options) -> EngineCore:
    config = {"block_size": 4, "num_blocks": NUM_BLOCKS, "async_scheduling": overlap} | options
    engine = EngineCore(model, None, EngineConfig(**config))
    if graphs:  # CPU stand-ins for CUDA graphs: decode steps replay through the graph buffers
        engine.runner.capture_graphs([1, 2, 4, 8], capture=EagerGraphCapture())
    return engine


def both_ways(model, requests, **options):
    """(synchronous outputs, overlapped outputs, the overlapped engine)."""
    sync_tokens, sync_finish = run_all(engine_for(model, False, **options), requests)
    engine = engine_for(model, True, **options)
    tokens, finish = run_all(engine, requests)
    return (sync_tokens, sync_finish), (tokens, finish), engine


def assert_all_blocks_free(engine: EngineCore) -> None:
    assert engine.kv_cache_manager.num_free_blocks == engine.num_blocks - 1  # all but null


def mixed_requests() -> dict:
    """Greedy and seeded requests of different lengths, one with n = 2 choices."""
    batch = prompts(6, seed=11)
    requests = {}
    for i, prompt in enumerate(batch):
        params = SamplingParams(temperature=0, max_tokens=5 + 3 * i, ignore_eos=True)
        if i % 2:
            params = SamplingParams(temperature=0.9, top_p=0.9, seed=i, max_tokens=4 + 2 * i)
        requests[f"r{i}"] = (prompt, params)
    n_params = SamplingParams(n=2, temperature=1.0, seed=5, max_tokens=9, ignore_eos=True)
    requests["n"] = (batch[0], n_params)
    return requests


@pytest.mark.parametrize("graphs,pick", [(False, False), (True, False), (True, True)])
def test_concurrent_greedy_and_seeded_requests_match_the_synchronous_engine(
    model, graphs, pick, monkeypatch
):
    """pick: the graphs' own greedy picks (GREEDY_IN_GRAPH), the seeded rows drawn over them."""
    monkeypatch.setattr(model_runner, "GREEDY_IN_GRAPH", pick)
    sync, overlapped, engine = both_ways(model, mixed_requests(), graphs=graphs)
    assert overlapped == sync
    assert engine.num_overlapped_steps > 10
    if graphs:
        assert engine.stats.runner_steps[GRAPH] > engine.num_overlapped_steps
    assert_all_blocks_free(engine)


def test_greedy_picks_of_the_graphs_are_fed_back_in_place(model, monkeypatch):
    """All greedy, with GREEDY_IN_GRAPH: the decode graphs' own picks (ModelRunner.last_greedy)
    are the sampled tokens, and continuations of the same batch feed them without a copy
    (runner.num_fed_in_place); the outputs are the synchronous engine's."""
    monkeypatch.setattr(model_runner, "GREEDY_IN_GRAPH", True)
    batch = prompts(3, seed=13)
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    requests = {str(i): (p, greedy) for i, p in enumerate(batch)}
    sync, overlapped, engine = both_ways(model, requests, graphs=True)
    assert overlapped == sync
    assert engine.runner.num_fed_in_place > 5
    assert_all_blocks_free(engine)


def test_stop_tokens_and_eos_end_requests_at_the_same_token(model):
    batch = prompts(4, seed=12)
    free = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    first_run, _ = run_all(
        engine_for(model, False), {str(i): (p, free) for i, p in enumerate(batch)}
    )
    stop_at = {i: first_run[(str(i), 0)][3 + 2 * i] for i in range(len(batch))}
    requests = {
        str(i): (p, SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[stop_at[i]]))
        for i, p in enumerate(batch)
    }
    (sync_tokens, sync_finish), (tokens, finish), engine = both_ways(model, requests)
    assert tokens == sync_tokens and finish == sync_finish
    assert set(finish.values()) == {"stop"}
    assert engine.num_overlapped_steps > 0
    assert_all_blocks_free(engine)
    # EOS: the model's end token, set on both engines alike
    eos = first_run[("1", 0)][6]
    eos_requests = {
        str(i): (p, SamplingParams(temperature=0, max_tokens=30)) for i, p in enumerate(batch)
    }
    results = []
    for overlap in (False, True):
        eos_engine = engine_for(model, overlap)
        eos_engine.eos_token_ids = (eos,)
        eos_engine.scheduler.eos_token_ids = frozenset([eos])
        results.append(run_all(eos_engine, eos_requests))
        assert_all_blocks_free(eos_engine)
    assert results[0] == results[1]
    assert results[1][1][("1", 0)] == "stop"


def test_abort_mid_generation_frees_every_block(model):
    params = SamplingParams(temperature=0, max_tokens=25, ignore_eos=True)
    batch = prompts(3, seed=13)
    outputs = []
    for overlap in (False, True):
        engine = engine_for(model, overlap)
        for i, prompt in enumerate(batch):
            engine.add_request(str(i), prompt, params)
        tokens = {str(i): [] for i in range(len(batch))}
        for step in range(40):
            if step == 8:
                assert not overlap or engine._in_flight is not None  # aborted while in flight
                engine.abort("1")
                assert "1" not in engine.scheduler.requests
            if not engine.has_unfinished_requests():
                break
            for out in engine.step():
                tokens[out.request_id] += out.new_token_ids
        assert_all_blocks_free(engine)
        outputs.append(tokens)
    assert outputs[0] == outputs[1]
    assert len(outputs[1]["0"]) == 25 and len(outputs[1]["1"]) < 25


def test_a_request_arriving_while_others_decode_falls_back_then_overlap_resumes(model):
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    late = SamplingParams(temperature=0.8, seed=3, max_tokens=12, ignore_eos=True)
    batch = prompts(3, seed=14)
    outputs = []
    for overlap in (False, True):
        engine = engine_for(model, overlap)
        engine.add_request("a", batch[0], params)
        engine.add_request("b", batch[1], params)
        tokens: dict[str, list[int]] = {"a": [], "b": [], "late": []}
        overlapped_before = 0
        while engine.has_unfinished_requests():
            if len(tokens["a"]) == 6 and not tokens["late"] and "late" not in engine.choices:
                overlapped_before = engine.num_overlapped_steps
                engine.add_request("late", batch[2], late)
            for out in engine.step():
                tokens[out.request_id] += out.new_token_ids
        if overlap:
            assert overlapped_before > 0
            assert engine.num_overlapped_steps > overlapped_before + 5  # resumed after the prefill
        assert_all_blocks_free(engine)
        outputs.append(tokens)
    assert outputs[0] == outputs[1]
    assert len(outputs[1]["late"]) == 12


def test_preemption_under_a_small_kv_budget_keeps_every_output(model):
    batch = prompts(6, seed=5)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    requests = {str(i): (p, params) for i, p in enumerate(batch)}
    sync, overlapped, engine = both_ways(model, requests, num_blocks=40)
    assert overlapped == sync
    assert engine.stats.num_preemptions > 0 and engine.num_overlapped_steps > 0
    assert_all_blocks_free(engine)


def test_requests_needing_host_tokens_run_synchronously(model):
    batch = prompts(2, seed=15)
    needs_host = [
        SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0.7, seed=1, max_tokens=8, ignore_eos=True, frequency_penalty=1),
        SamplingParams(temperature=0, max_tokens=8, min_tokens=8),
    ]
    for params in needs_host:
        requests = {str(i): (p, params) for i, p in enumerate(batch)}
        sync, overlapped, engine = both_ways(model, requests)
        assert overlapped == sync
        assert engine.num_overlapped_steps == 0


def test_stop_strings_cut_the_same_text():
    llms = [
        LLM(
            str(default_model_path()),
            dtype="float32",
            max_model_len=512,
            num_blocks=256,
            async_scheduling=overlap,
        )
        for overlap in (False, True)
    ]
    prompt = "class Stack:\n    def __init__(self):\n"
    free = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    full = llms[0].generate(prompt, free, use_tqdm=False)[0].outputs[0].text
    stop = full[10:14]
    params = [
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop]),
        SamplingParams(temperature=0.8, seed=7, max_tokens=40, stop=["\n\n"]),
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
    ]
    results = [llm.generate([prompt] * 3, params, use_tqdm=False) for llm in llms]
    for sync, overlapped in zip(*results, strict=True):
        assert overlapped.outputs == sync.outputs
    assert results[1][0].outputs[0].finish_reason == "stop"
    assert results[1][0].outputs[0].text == full[: full.find(stop)]
    engine = llms[1].engine
    assert engine.num_overlapped_steps > 0
    assert_all_blocks_free(engine)


def test_device_tokens_of_continuing_requests_are_gathered_after_a_finish(model):
    """A request ending between two overlapped steps leaves a hole in the in-flight batch: the
    next continuation feeds the others their own tokens (a gather on the device)."""
    batch = prompts(3, seed=16)
    requests = {
        str(i): (p, SamplingParams(temperature=0, max_tokens=6 + 5 * i, ignore_eos=True))
        for i, p in enumerate(batch)
    }
    sync, overlapped, engine = both_ways(model, requests)
    assert overlapped == sync
    steps_per_request = [6 + 5 * i for i in range(3)]
    # overlap never stopped for a finish: only the prefill step and the chain starts are not
    assert engine.num_overlapped_steps >= max(steps_per_request) - 3
    assert_all_blocks_free(engine)


def test_async_engine_streams_and_aborts_with_overlapped_steps(model):
    core = engine_for(model, True)
    engine = AsyncEngine(core, "tiny")
    greedy = SamplingParams(temperature=0, max_tokens=15, ignore_eos=True)
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    batch = prompts(3, seed=17)

    async def collect(prompt, request_id, leave_after=None):
        tokens = []
        stream = engine.generate(prompt, long if leave_after else greedy, request_id)
        async for output in stream:
            tokens += output.new_token_ids
            if leave_after and len(tokens) >= leave_after:
                break
        await stream.aclose()
        return tokens

    async def main():
        return await asyncio.gather(
            collect(batch[0], "a"), collect(batch[1], "b"), collect(batch[2], "leaver", 5)
        )

    try:
        results = asyncio.run(main())
        deadline = time.monotonic() + 10
        while core.has_unfinished_requests() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        engine.shutdown()
    sync, _ = run_all(engine_for(model, False), {"a": (batch[0], greedy), "b": (batch[1], greedy)})
    assert results[:2] == [sync[("a", 0)], sync[("b", 0)]]
    assert len(results[2]) >= 5
    assert core.num_overlapped_steps > 0
    assert not core.has_unfinished_requests()
    assert_all_blocks_free(core)


def test_requests_running_into_the_context_end_stop_at_the_same_token(model):
    long_prompt = (prompts(1, seed=18)[0] * 20)[:243]  # 13 positions left of 256
    requests = {
        "edge": (long_prompt, SamplingParams(temperature=0, max_tokens=None, ignore_eos=True)),
        "short": (prompts(1, seed=19)[0], SamplingParams(temperature=0, max_tokens=30)),
    }
    sync, overlapped, engine = both_ways(model, requests)
    assert overlapped == sync
    assert len(overlapped[0][("edge", 0)]) == 256 - 243 and overlapped[1][("edge", 0)] == "length"
    assert engine.num_overlapped_steps > 0
    assert_all_blocks_free(engine)


def test_the_command_line_overlaps_unless_told_not_to():
    """`gossamer serve` and friends run overlapped steps by default (measured faster on the
    H200); --no-async-scheduling gives synchronous ones."""
    import argparse

    from gossamer.engine.args import add_engine_arguments, engine_config_from_args

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert engine_config_from_args(parser.parse_args([])).async_scheduling
    assert not engine_config_from_args(
        parser.parse_args(["--no-async-scheduling"])
    ).async_scheduling
