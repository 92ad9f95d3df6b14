"""Decode graphs per context bucket (model_runner.CONTEXT_GRAPHS) on the GPU: a graph captured at
the bucket that holds a step's context launches attention's key splits as an uncaptured step of
that context does, so its replay gives the eager step's logits bit for bit."""

from __future__ import annotations

import pytest
import torch

from gossamer.kernels import attention
from gossamer.runner import model_runner
from gossamer.runner.model_runner import GRAPH, ModelRunner, SeqInput
from tests.kernels.test_triton_model import SMALL, small_triton_model

pytestmark = pytest.mark.gpu

MAX_LEN = 4096
BLOCK = 16


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return small_triton_model(
        tmp_path_factory.mktemp("context_graphs_gpu"), seed=31, max_model_len=MAX_LEN
    )


CONTEXTS = (300, 1000, 3000)


@pytest.fixture(scope="module")
def runners(model) -> dict[bool, ModelRunner]:
    """By cuda_graphs: a runner with context graphs, and an eager one."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(model_runner, "CONTEXT_GRAPHS", True)
        return {
            graphs: ModelRunner(
                model,
                num_blocks=1 + len(CONTEXTS) * MAX_LEN // BLOCK,
                block_size=BLOCK,
                max_num_seqs=2,
                max_num_batched_tokens=MAX_LEN,
                cuda_graphs=graphs,
                graph_sizes=(1, 2),
            )  # fmt: skip
            for graphs in (True, False)
        }


def decode_logits(runner: ModelRunner, context: int) -> torch.Tensor:
    """A prompt of `context` - 1 tokens (in blocks of its own), then one decode step's logits."""
    gen = torch.Generator().manual_seed(context)
    prompt = torch.randint(0, SMALL["vocab_size"], (context,), generator=gen).tolist()
    first = 1 + CONTEXTS.index(context) * MAX_LEN // BLOCK
    table = (list(range(first, first + -(-context // BLOCK))),) * runner.num_groups
    runner.run([SeqInput(prompt[:-1], 0, table)])
    logits = runner.run([SeqInput(prompt[-1:], context - 1, table)]).clone()
    torch.cuda.synchronize()
    return logits


@pytest.mark.parametrize("context", CONTEXTS)
def test_a_bucket_graph_replays_the_eager_step(model, runners, context):
    graphed = runners[True]
    heads = SMALL["num_key_value_heads"]
    bounds = attention.decode_context_bounds(1, 1, heads, MAX_LEN, torch.device("cuda"))
    wanted = [bound for bound in bounds if bound >= model_runner.CONTEXT_GRAPH_MIN_LEN]
    assert wanted and [bound for bound, *_ in graphed.context_graphs[(1, 1)]] == wanted
    replays = graphed.step_modes[GRAPH]
    replayed = decode_logits(graphed, context)
    assert graphed.step_modes[GRAPH] == replays + 1
    eager = decode_logits(runners[False], context)
    if context >= wanted[0]:  # (below the first bound the bucket launches more splits)
        assert torch.equal(replayed, eager)
    else:
        torch.testing.assert_close(replayed, eager, rtol=0.02, atol=0.02)
