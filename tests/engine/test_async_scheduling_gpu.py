"""Overlapped scheduling on the GPU: the built-in model in bf16 with the Triton ops and CUDA graphs.

Both engines run the same kernels on the same batch shapes (graph replays for every decode step),
so their outputs must agree token for token: this checks the device-side parts that the CPU tests
cannot (pinned non-blocking copies and events, the device-to-device copy of the sampled tokens
into a captured graph's input buffer, freeing blocks while a step still runs)."""

from __future__ import annotations

import pytest
import torch

from gossamer.engine.core import EngineConfig, EngineCore
from gossamer.model.loader import load_model
from gossamer.models import default_model_path
from gossamer.runner.model_runner import GRAPH
from gossamer.sampling_params import SamplingParams
from gossamer.tokenizer import Tokenizer
from tests.engine.test_engine import run_all

pytestmark = pytest.mark.gpu

PROMPTS = [
    "import os\n\n\ndef ",
    "class Stack:\n    def __init__(self):\n",
    "# Read a file\n",
    "def fibonacci(n):\n",
    "for i in range(10):\n",
]


@pytest.fixture(scope="module")
def setup():
    path = default_model_path()
    model = load_model(str(path), dtype="bfloat16", device="cuda", max_model_len=512).model
    return model, Tokenizer.from_file(path)


def engine_for(setup, overlap: bool) -> EngineCore:
    model, tokenizer = setup
    config = EngineConfig(num_blocks=512, max_num_seqs=16, async_scheduling=overlap)
    return EngineCore(model, tokenizer, config)


def requests(tokenizer: Tokenizer) -> dict:
    params = [
        SamplingParams(temperature=0, max_tokens=60, ignore_eos=True),
        SamplingParams(temperature=0.8, seed=1, max_tokens=45, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=80, stop=["\n\n"]),
        SamplingParams(temperature=1.0, top_p=0.9, seed=2, max_tokens=70),
        SamplingParams(temperature=0, max_tokens=33, ignore_eos=True),
    ]
    return {
        str(i): (tokenizer.encode(prompt), p)
        for i, (prompt, p) in enumerate(zip(PROMPTS, params, strict=True))
    }


def test_overlapped_outputs_equal_synchronous_ones_on_the_gpu(setup):
    batch = requests(setup[1])
    sync = run_all(engine_for(setup, False), batch)
    engine = engine_for(setup, True)
    overlapped = run_all(engine, batch)
    assert overlapped == sync
    assert engine.num_overlapped_steps > 20
    assert engine.stats.runner_steps[GRAPH] > engine.num_overlapped_steps
    assert engine.kv_cache_manager.num_free_blocks == engine.num_blocks - 1


def test_abort_while_a_step_is_in_flight_frees_its_blocks_on_the_gpu(setup):
    engine = engine_for(setup, True)
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    for request_id, (prompt, _) in requests(setup[1]).items():
        engine.add_request(request_id, prompt, params)
    for _ in range(20):
        engine.step()
    assert engine._in_flight is not None
    engine.abort("0")
    engine.abort("3")
    tokens = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    assert set(tokens) == {"1", "2", "4"}
    assert engine.kv_cache_manager.num_free_blocks == engine.num_blocks - 1


def test_fp8_kv_cache_keeps_the_greedy_continuations_on_the_gpu(setup):
    """The trained built-in model over an fp8 cache (Triton kernels, graphs, overlapped steps):
    the greedy requests start as over the bf16 cache (e4m3 moves logits a little, so long
    continuations may part), and every block comes back."""
    model, tokenizer = setup
    batch = requests(tokenizer)
    exact = run_all(engine_for(setup, True), batch)
    config = EngineConfig(num_blocks=512, max_num_seqs=16, async_scheduling=True,
                          kv_cache_dtype="fp8")  # fmt: skip
    engine = EngineCore(model, tokenizer, config)
    assert engine.runner.kv_cache.dtype == torch.float8_e4m3fn
    rounded = run_all(engine, batch)
    assert engine.stats.runner_steps[GRAPH] > 20
    for key in (("0", 0), ("2", 0), ("4", 0)):  # the greedy ones
        assert rounded[0][key][:4] == exact[0][key][:4], key
    assert engine.kv_cache_manager.num_free_blocks == engine.num_blocks - 1
