"""Non-blocking uploads on the GPU (runner/host_copy.py): with a long kernel queued first
(torch.cuda._sleep), launching a step (fill, upload, graph replay, device-side sampling) and an
overlapped engine step return while that kernel still runs, and the results stay right: the
next step's fill waits for the previous uploads (`UploadFence`) instead of corrupting them."""

from __future__ import annotations

import pytest
import torch

from gossamer.engine.core import EngineConfig, EngineCore
from gossamer.engine.overlap import sample_on_device
from gossamer.model.loader import load_model
from gossamer.models import default_model_path
from gossamer.runner.model_runner import GRAPH, ModelRunner, SeqInput
from gossamer.runner.sampler import Sampler, SamplingRow
from gossamer.sampling_params import SamplingParams
from gossamer.tokenizer import Tokenizer
from tests.engine.test_engine import run_all

pytestmark = pytest.mark.gpu

# about a quarter of a second at the H200's clock: far longer than launching a step
SLEEP_CYCLES = 5 * 10**8
BLOCK = 16
PROMPTS = ["import os\n\n\ndef ", "class Stack:\n    def __init__(self):\n", "# Read a file\n"]


@pytest.fixture(scope="module")
def setup():
    path = default_model_path()
    model = load_model(str(path), dtype="bfloat16", device="cuda", max_model_len=512).model
    return model, Tokenizer.from_file(path)


@pytest.fixture(scope="module")
def runner(setup):
    return ModelRunner(
        setup[0], num_blocks=64, block_size=BLOCK, max_num_seqs=4, max_num_batched_tokens=256
    )


def gpu_busy() -> torch.cuda.Event:
    """Queue a long kernel; the returned event completes when it ends."""
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    busy = torch.cuda.Event()
    busy.record()
    return busy


def tables(i: int) -> tuple[list[int], ...]:
    return (list(range(1 + 8 * i, 9 + 8 * i)),) * 2


def prefill(runner: ModelRunner, prompts: list[list[int]]) -> None:
    runner.run([SeqInput(p, 0, tables(i)) for i, p in enumerate(prompts)])
    torch.cuda.synchronize()


def decode(prompts: list[list[int]], tokens: list[int]) -> list[SeqInput]:
    return [
        SeqInput([token], len(p), tables(i))
        for i, (p, token) in enumerate(zip(prompts, tokens, strict=True))
    ]


def sampling_rows(count: int) -> list[SamplingRow]:
    """Greedy rows and one seeded random row (its noise is drawn on the host, pinned)."""
    greedy = SamplingParams(temperature=0)
    rows = [SamplingRow(greedy, [], [], None) for _ in range(count - 1)]
    seeded = SamplingParams(temperature=0.8, top_p=0.9, seed=1)
    return [*rows, SamplingRow(seeded, [], [], torch.Generator().manual_seed(1))]


def test_host_buffers_are_pinned(runner):
    assert runner.inputs.host_bytes.is_pinned()


def test_a_step_launches_while_the_gpu_is_busy(setup, runner):
    prompts = [setup[1].encode(p) for p in PROMPTS]
    prefill(runner, prompts)
    step = decode(prompts, [11, 22, 33])
    expected = runner.run(step).clone()
    expected_tokens = sample_on_device(Sampler(), expected, sampling_rows(3))
    torch.cuda.synchronize()
    busy = gpu_busy()
    modes = runner.step_modes[GRAPH]
    logits = runner.run(step)  # the same step again: the same KV written, the same logits
    tokens = sample_on_device(Sampler(), logits, sampling_rows(3))
    assert not busy.query(), "the step's launch waited for the GPU"
    assert runner.step_modes[GRAPH] == modes + 1
    torch.cuda.synchronize()
    torch.testing.assert_close(logits, expected, rtol=1e-3, atol=1e-3)
    assert tokens.tolist() == expected_tokens.tolist()


def test_the_next_fill_waits_for_the_uploads_still_queued(setup, runner):
    """Two steps with different inputs launched back to back while the GPU is busy: the second
    waits (its fill would otherwise rewrite the first's pending inputs); both give their own
    logits."""
    prompts = [setup[1].encode(p) for p in PROMPTS]
    first, second = decode(prompts, [11, 22, 33]), decode(prompts, [44, 55, 66])
    prefill(runner, prompts)
    expected_first = runner.run(first).clone()
    expected_second = runner.run(second).clone()
    busy = gpu_busy()
    got_first = runner.run(first).clone()
    assert not busy.query()
    got_second = runner.run(second).clone()
    assert busy.query(), "the second fill did not wait for the first step's uploads"
    torch.cuda.synchronize()
    torch.testing.assert_close(got_first, expected_first, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(got_second, expected_second, rtol=1e-3, atol=1e-3)


def engine_for(setup, overlap: bool) -> EngineCore:
    model, tokenizer = setup
    config = EngineConfig(num_blocks=256, max_num_seqs=8, async_scheduling=overlap)
    return EngineCore(model, tokenizer, config)


def requests(tokenizer: Tokenizer, count: int) -> dict:
    greedy = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    return {str(i): (tokenizer.encode(PROMPTS[i % 3] * (1 + i)), greedy) for i in range(count)}


@pytest.mark.parametrize("batch", [1, 4])
def test_overlapped_greedy_tokens_equal_synchronous_ones(setup, batch):
    sync = run_all(engine_for(setup, False), requests(setup[1], batch))
    engine = engine_for(setup, True)
    assert run_all(engine, requests(setup[1], batch)) == sync
    assert engine.num_overlapped_steps > 30


@pytest.mark.parametrize("seeded", [False, True])
def test_an_overlapped_engine_step_returns_while_the_gpu_is_busy(setup, seeded):
    """With a step in flight, step() launches the next one behind the long kernel and applies
    the one in flight, whose tokens were ready before it: it never waits for the kernel."""
    engine = engine_for(setup, True)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    if seeded:
        params = SamplingParams(temperature=0.8, seed=3, max_tokens=40, ignore_eos=True)
    for request_id, (prompt, _) in requests(setup[1], 3).items():
        engine.add_request(request_id, prompt, params)
    while engine._in_flight is None:
        engine.step()
    engine.step()  # a continuation launched from a continuation
    busy = gpu_busy()
    launched = engine.num_overlapped_steps
    engine.step()
    assert engine.num_overlapped_steps == launched + 1
    assert not busy.query(), "the overlapped step waited for the GPU"
    while engine.has_unfinished_requests():
        engine.step()
