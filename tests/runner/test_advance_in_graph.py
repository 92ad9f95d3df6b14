"""Inputs advanced in the graph (model_runner.ADVANCE_IN_GRAPH, with GREEDY_IN_GRAPH): a batch-1
decode graph moves its own positions, sequence length and slots on by a token, and the next step,
fed its pick in place, uploads nothing. Checked on the CPU (EagerGraphCapture stands in for the
graphs; TorchOps advances with DecodeAdvance.apply): every step's logits equal those of a runner
that uploads every step, uploads are left out exactly when the device holds the step's inputs,
and anything else (a growing block table, ids from the host or copied on the device, another
layout in between) uploads again."""

from __future__ import annotations

import pytest
import torch

from gossamer.model.loader import load_model
from gossamer.runner import model_runner
from gossamer.runner.model_runner import GRAPH, EagerGraphCapture, ModelRunner, SeqInput
from tests.hf_models import write_hf_model

BLOCK = 4


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_hf_model(tmp_path_factory.mktemp("advance"), seed=29, num_hidden_layers=2)
    return load_model(str(path), dtype="float32").model


def runner(model, monkeypatch, advance: bool) -> ModelRunner:
    monkeypatch.setattr(model_runner, "GREEDY_IN_GRAPH", True)
    monkeypatch.setattr(model_runner, "ADVANCE_IN_GRAPH", advance)
    made = ModelRunner(model, num_blocks=64, block_size=BLOCK, max_num_seqs=2,
                       max_num_batched_tokens=32)  # fmt: skip
    made.capture_graphs([1, 2], capture=EagerGraphCapture())
    return made


def tables(length: int, first: int = 1) -> tuple[list[int], list[int]]:
    """Both groups' tables of a sequence of `length` tokens (blocks first, first + 1, ...)."""
    blocks = list(range(first, first + -(-length // BLOCK)))
    return (blocks, blocks)


class Twins:
    """The same steps on a runner that advances in the graph and one that uploads every step."""

    def __init__(self, model, monkeypatch) -> None:
        self.advancing = runner(model, monkeypatch, advance=True)
        self.uploading = runner(model, monkeypatch, advance=False)
        assert self.advancing.advance_in_graph and not self.uploading.advance_in_graph

    def prefill(self, prompt: list[int], table) -> None:
        for each in (self.advancing, self.uploading):
            each.run([SeqInput(prompt, 0, table)])

    def decode(self, start: int, table, token: int | None = None) -> bool:
        """One decode step, fed the last pick in place (token None) or `token` from the host;
        asserts equal logits and picks, returns whether the advancing runner uploaded."""
        skipped = self.advancing.inputs.num_skipped
        outs = []
        for each in (self.advancing, self.uploading):
            fed = each.last_greedy if token is None else None
            ids = [0 if token is None else token]
            outs.append(each.run([SeqInput(ids, start, table)], device_input_ids=fed).clone())
        torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
        assert torch.equal(self.advancing.last_greedy, self.uploading.last_greedy)
        return self.advancing.inputs.num_skipped == skipped


def test_fed_steps_upload_nothing_while_the_device_holds_their_inputs(model, monkeypatch):
    twins = Twins(model, monkeypatch)
    prompt = list(range(3, 12))  # 9 tokens
    full = tables(40)  # every block the steps below reach, from the start
    twins.prefill(prompt, full)
    uploaded = [twins.decode(len(prompt) + i, full) for i in range(10)]
    # the first after the prompt (another layout; its id from the host: a prompt step picks
    # nothing) uploads, and so does the second (its id in place: -1 on the host); the rest cross
    # 2 blocks without one
    assert uploaded == [True, True] + [False] * 8
    assert twins.advancing.step_modes[GRAPH] == 10
    assert twins.advancing.inputs.num_skipped == 8 and twins.uploading.inputs.num_skipped == 0


def test_what_the_device_cannot_know_uploads_again(model, monkeypatch):
    twins = Twins(model, monkeypatch)
    prompt = list(range(5, 12))  # 7 tokens: blocks 1 and 2
    twins.prefill(prompt, tables(8))
    start = len(prompt)
    assert twins.decode(start, tables(8))  # another layout before
    # the table grows a block (position 8 is in block 3): its new column was never uploaded
    assert twins.decode(start + 1, tables(12))
    assert not twins.decode(start + 2, tables(12))
    assert not twins.decode(start + 3, tables(12))
    assert twins.decode(start + 4, tables(12), token=41)  # an id from the host
    assert twins.decode(start + 5, tables(16))  # grows again (and the host's id is -1 again)
    assert not twins.decode(start + 6, tables(16))
    # a step of another layout (a second prompt) in between
    # (after a prompt step, which picks nothing, the host feeds an id, and the next step's is -1)
    twins.prefill([7, 8, 9], tables(4, first=20))
    assert twins.decode(start + 7, tables(20))
    assert twins.decode(start + 8, tables(20))
    assert not twins.decode(start + 9, tables(20))


def test_ids_copied_on_the_device_are_not_known_to_the_host(model, monkeypatch):
    """Ids fed from another device tensor are copied into the input buffer on the device: the
    host's placeholder is not what the device holds, so a next step whose host id is that
    placeholder (a real token 0 here) uploads, though everything else the graph advanced."""
    twins = Twins(model, monkeypatch)
    prompt = list(range(4, 10))
    twins.prefill(prompt, tables(20))
    twins.decode(len(prompt), tables(20))
    for each in (twins.advancing, twins.uploading):
        fed = torch.tensor([41], device=model.device)
        each.run([SeqInput([0], len(prompt) + 1, tables(20))], device_input_ids=fed)
    assert twins.decode(len(prompt) + 2, tables(20), token=0)
    assert twins.decode(len(prompt) + 3, tables(20))  # in place: -1 on the host
    assert not twins.decode(len(prompt) + 4, tables(20))


def test_other_batch_sizes_do_not_advance(model, monkeypatch):
    """Only batch-1 graphs advance (the GEMV's pick makes it there): a batch-2 decode step
    uploads every time, and its results equal the uploading runner's."""
    twins = Twins(model, monkeypatch)
    seqs_tables = [tables(20), tables(20, first=30)]
    for each in (twins.advancing, twins.uploading):
        each.run([SeqInput([1, 2, 3], 0, t) for t in seqs_tables])
    for step in range(3):
        outs = []
        for each in (twins.advancing, twins.uploading):
            seqs = [SeqInput([0], 3 + step, t) for t in seqs_tables]
            outs.append(each.run(seqs, device_input_ids=each.last_greedy).clone())
        torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    assert twins.advancing.inputs.num_skipped == 0
