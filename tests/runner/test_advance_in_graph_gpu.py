"""Inputs advanced in the graph (model_runner.ADVANCE_IN_GRAPH) on the GPU: batch-1 decode graphs
of the Triton model, fed their picks in place, move their own inputs on and skip the uploads,
giving the logits and picks of a runner that uploads every step, bit for bit, across block
boundaries and a table that grows."""

from __future__ import annotations

import pytest
import torch

from gossamer.runner import model_runner
from gossamer.runner.model_runner import GRAPH, ModelRunner, SeqInput
from tests.kernels.test_triton_model import SMALL, small_triton_model

pytestmark = pytest.mark.gpu

BLOCK = 16


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return small_triton_model(tmp_path_factory.mktemp("advance_gpu"), seed=37, max_model_len=1024)


def runner(model, advance: bool) -> ModelRunner:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(model_runner, "GREEDY_IN_GRAPH", True)
        patch.setattr(model_runner, "ADVANCE_IN_GRAPH", advance)
        return ModelRunner(model, num_blocks=64, block_size=BLOCK, max_num_seqs=1,
                           max_num_batched_tokens=256, graph_sizes=(1,))  # fmt: skip


def test_advancing_graphs_decode_as_uploading_ones(model):
    prompt = torch.randint(
        0, SMALL["vocab_size"], (70,), generator=torch.Generator().manual_seed(3)
    )
    runners = [runner(model, advance=True), runner(model, advance=False)]
    assert runners[0].advance_in_graph and not runners[1].advance_in_graph
    results = []
    for each in runners:
        table = (list(range(1, 7)),) * each.num_groups  # 96 positions
        each.run([SeqInput(prompt.tolist(), 0, table)])
        logits = []
        for step in range(40):  # positions 70..109: the table grows at 96
            if step == 26:
                table = (list(range(1, 9)),) * each.num_groups
            fed = each.last_greedy
            seqs = [SeqInput([int(prompt[-1])], 70 + step, table)]
            logits.append(each.run(seqs, device_input_ids=fed).clone())
        torch.cuda.synchronize()
        results.append(torch.stack(logits))
        assert each.step_modes[GRAPH] == 40
    assert torch.equal(results[0], results[1])
    # uploads: the first two steps (after a prompt; then the first fed in place) and the growth
    assert runners[0].inputs.num_skipped == 40 - 3 and runners[1].inputs.num_skipped == 0
