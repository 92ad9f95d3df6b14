"""Which steps replay a captured CUDA graph, and the count of how each step ran, checked on the CPU
with a fake graph table (capture needs a GPU)."""

from __future__ import annotations

import pytest
import torch

from gossamer.model.loader import load_model
from gossamer.runner.model_runner import (
    EAGER_MIXED,
    EAGER_NO_GRAPH_FOR_SHAPE,
    EAGER_NO_GRAPHS,
    EAGER_PREFILL,
    GRAPH,
    ModelRunner,
    SeqInput,
    plan_step,
)
from tests.hf_models import write_hf_model

GRAPH_KEYS = {(1, 1), (2, 1), (4, 1), (1, 3), (2, 3)}  # (batch size, tokens per sequence)


def seq(num_tokens: int, num_logits: int | None = None, start: int = 0) -> SeqInput:
    logits = num_tokens if num_logits is None else num_logits
    return SeqInput([5] * num_tokens, start, ([1, 2],), logits)


@pytest.mark.parametrize(
    ("seqs", "expected"),
    [
        ([seq(1)], ((1, 1), GRAPH)),
        ([seq(1)] * 3, ((4, 1), GRAPH)),  # the smallest graph that holds the batch
        ([seq(3)] * 2, ((2, 3), GRAPH)),  # verification of 2 drafts each
        ([seq(1)] * 5, (None, EAGER_NO_GRAPH_FOR_SHAPE)),  # larger than every q = 1 graph
        ([seq(2)], (None, EAGER_NO_GRAPH_FOR_SHAPE)),  # no graph for q = 2
        ([seq(5, 1)], (None, EAGER_PREFILL)),  # the tail of a prompt after a prefix-cache hit
        ([seq(1), seq(4, 0)], (None, EAGER_PREFILL)),  # a decode beside a prompt chunk
        ([seq(1), seq(3)], (None, EAGER_MIXED)),  # drafts of different lengths
    ],
)
def test_plan_step_picks_a_graph_or_names_why_not(seqs, expected):
    assert plan_step(seqs, GRAPH_KEYS) == expected


def test_without_graphs_every_step_is_eager_for_lack_of_them():
    assert plan_step([seq(1)], {}) == (None, EAGER_NO_GRAPHS)


class FakeGraph:
    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


def test_runner_replays_the_planned_graph_and_counts_every_step(tmp_path):
    model = load_model(str(write_hf_model(tmp_path, seed=5)), dtype="float32").model
    runner = ModelRunner(
        model, num_blocks=32, block_size=4, max_num_seqs=4, max_num_batched_tokens=32
    )
    vocab = model.config.vocab_size
    runner.graphs = {key: FakeGraph() for key in [(1, 1), (2, 1)]}
    runner.graph_logits = {key: torch.full((key[0], vocab), 7.0) for key in runner.graphs}
    tables = ([1, 2], [3, 4])
    runner.run([SeqInput([3, 4, 5], 0, tables)])  # prompt: eager
    logits = runner.run([SeqInput([6], 3, tables)])  # decode: replays (1, 1)
    assert runner.graphs[(1, 1)].replays == 1 and bool((logits == 7.0).all())
    runner.run([SeqInput([6], 3, tables)] * 3)  # no graph of 3 or more sequences
    assert runner.step_modes == {EAGER_PREFILL: 1, GRAPH: 1, EAGER_NO_GRAPH_FOR_SHAPE: 1}
