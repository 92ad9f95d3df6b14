"""EngineStats.runner_steps: how many target-model steps replayed a CUDA graph and why the others
ran eagerly, checked on the CPU with a fake graph table."""

from __future__ import annotations

import pytest
import torch

from gossamer.engine.core import UNREPORTED_STEPS, EngineConfig, EngineCore
from gossamer.model.loader import load_model
from gossamer.runner.model_runner import EAGER_NO_GRAPHS, EAGER_PREFILL, GRAPH
from gossamer.sampling_params import SamplingParams
from tests.hf_models import write_hf_model

PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_hf_model(tmp_path_factory.mktemp("steps"), seed=7, num_hidden_layers=1)
    return load_model(str(path), dtype="float32", max_model_len=64).model


def engine_for(model) -> EngineCore:
    return EngineCore(model, None, EngineConfig(block_size=4, num_blocks=64, max_num_seqs=4))


class FakeGraph:
    def replay(self) -> None:
        pass


def run(engine: EngineCore, prompts: list[list[int]]) -> None:
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, PARAMS)
    while engine.has_unfinished_requests():
        engine.step()


def test_decodes_that_a_graph_holds_count_as_replays(model):
    engine = engine_for(model)
    runner, vocab = engine.runner, model.config.vocab_size
    runner.graphs = {(size, 1): FakeGraph() for size in (1, 2, 4)}
    runner.graph_logits = {key: torch.zeros(key[0], vocab) for key in runner.graphs}
    run(engine, [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11, 12]])
    # one step computes the three prompts, then three decode steps of 3 replay the graph of 4
    assert engine.stats.runner_steps == {EAGER_PREFILL: 1, GRAPH: 3}


def test_without_graphs_every_step_counts_as_eager(model):
    engine = engine_for(model)
    run(engine, [[1, 2, 3]])
    assert engine.stats.runner_steps == {EAGER_NO_GRAPHS: 4}


class CountlessRunner:
    """A runner that keeps no step_modes (like a test double or a runner of its own)."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def run(self, seqs):
        return self.inner.run(seqs)


def test_steps_of_a_runner_that_does_not_count_them_are_reported_as_such(model):
    inner = engine_for(model).runner
    engine = EngineCore(
        model, None, EngineConfig(block_size=4, num_blocks=64), runner=CountlessRunner(inner)
    )
    run(engine, [[1, 2, 3]])
    assert engine.stats.runner_steps == {UNREPORTED_STEPS: 4}
