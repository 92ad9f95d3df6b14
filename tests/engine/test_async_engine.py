from __future__ import annotations

import asyncio
import time

import pytest

from gossamer.engine.async_engine import AsyncEngine
from gossamer.engine.core import EngineConfig, EngineCore
from gossamer.engine.errors import PromptTooLongError
from gossamer.engine.reference import generate_stream
from gossamer.model.loader import load_model
from gossamer.sampling_params import SamplingParams
from tests.hf_models import write_hf_model


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = write_hf_model(tmp_path_factory.mktemp("async"), seed=41, num_hidden_layers=2)
    model = load_model(str(path), dtype="float32", max_model_len=128).model
    core = EngineCore(model, None, EngineConfig(block_size=4, num_blocks=200))
    engine = AsyncEngine(core, "tiny")
    yield engine
    engine.shutdown()


async def collect(engine, prompt, params, request_id):
    tokens = []
    async for output in engine.generate(prompt, params, request_id):
        tokens += output.new_token_ids
        last = output
    return tokens, last


def test_concurrent_streams_match_the_reference(engine):
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    prompts = [[3, 4, 5], [9, 8, 7, 6, 5, 4], [100] * 11]

    async def main():
        return await asyncio.gather(
            *(collect(engine, p, params, f"r{i}") for i, p in enumerate(prompts))
        )

    results = asyncio.run(main())
    for prompt, (tokens, last) in zip(prompts, results, strict=True):
        assert tokens == list(generate_stream(engine.core.runner.model, prompt, 10))
        assert last.finished and last.finish_reason == "length"
        assert last.num_prompt_tokens == len(prompt) and last.num_output_tokens == 10


def test_leaving_a_stream_early_aborts_and_frees_blocks(engine):
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    free_before = engine.core.kv_cache_manager.num_free_blocks

    async def main():
        stream = engine.generate([1, 2, 3, 4, 5], params, "leaver")
        async for output in stream:
            if output.num_output_tokens >= 3:
                break
        await stream.aclose()

    asyncio.run(main())
    deadline = time.monotonic() + 10
    while engine.core.has_unfinished_requests() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not engine.core.has_unfinished_requests()
    assert engine.core.kv_cache_manager.num_free_blocks == free_before


def test_bad_request_raises_before_streaming(engine):
    async def main():
        async for _ in engine.generate([1] * 200, SamplingParams(), "too-long"):
            pass

    with pytest.raises(PromptTooLongError):
        asyncio.run(main())
    assert engine.is_ready()
