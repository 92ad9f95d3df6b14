"""The runner's uploads from persistent host arrays (pinned and non-blocking on the GPU,
runner/host_copy.py), checked on the CPU: each step's inputs reach the device buffers, outputs stay
those of the reference, and no step rewrites the host arrays before the previous step's copies have
run (`UploadFence`, driven here by an event that checks for exactly that)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gossamer.engine.reference import ContiguousCache, forward_tokens
from gossamer.model.loader import load_model
from gossamer.runner.model_runner import GRAPH, EagerGraphCapture, ModelRunner, SeqInput
from gossamer.runner.sampler import exponential_noise, exponential_noise_rows
from gossamer.spec.tree import ancestor_masks
from tests.hf_models import write_hf_model

BLOCK = 4


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_hf_model(tmp_path_factory.mktemp("pinned"), seed=29, num_hidden_layers=2)
    return load_model(str(path), dtype="float32", max_model_len=128).model


def make_runner(model, tree_query_len: int | None = None) -> ModelRunner:
    runner = ModelRunner(
        model,
        num_blocks=96,
        block_size=BLOCK,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        tree_query_len=tree_query_len,
    )
    query_lens = (1,) if tree_query_len is None else (1, tree_query_len)
    runner.capture_graphs([1, 2, 4], query_lens, capture=EagerGraphCapture())
    return runner


class CheckingEvent:
    """Stands in for the fence's CUDA event. `record` snapshots what the queued copies would read
    (every host array); `synchronize` (the copies have run) first checks that nothing rewrote
    them meanwhile, which is what would corrupt a pending non-blocking copy on the GPU."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.snapshot: dict[str, np.ndarray] | None = None
        self.records = self.waits = 0

    def arrays(self) -> dict[str, np.ndarray]:
        return {"step inputs": self.runner.inputs.host_bytes.numpy()}

    def record(self) -> None:
        self.check()
        self.snapshot = {name: array.copy() for name, array in self.arrays().items()}
        self.records += 1

    def synchronize(self) -> None:
        self.check()
        self.snapshot = None
        self.waits += 1

    def check(self) -> None:
        for name, array in self.arrays().items():
            if self.snapshot is not None and not np.array_equal(array, self.snapshot[name]):
                raise AssertionError(f"host {name} rewritten before its upload ran")


def guarded(runner: ModelRunner) -> CheckingEvent:
    event = CheckingEvent(runner)
    runner.upload_fence.event = event
    return event


def tables_of(i: int) -> tuple[list[int], list[int]]:
    """Sequence i's block tables (two cache groups), disjoint from the others': 40 positions."""
    first = 1 + 20 * i
    return list(range(first, first + 10)), list(range(first + 10, first + 20))


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(0, 320, (n,), generator=gen).tolist() for n in (11, 6, 17)]


def decode_steps(runner: ModelRunner, count: int) -> list[torch.Tensor]:
    """Three prompts in one eager step, then `count` decode steps (graph replays) with different
    tokens each time; every step's logits (cloned: graph outputs are rewritten by the next)."""
    batch = prompts()
    outputs = [runner.run([SeqInput(p, 0, tables_of(i)) for i, p in enumerate(batch)]).clone()]
    for step in range(count):
        seqs = [
            SeqInput([(13 * step + 7 * i) % 320], len(p) + step, tables_of(i))
            for i, p in enumerate(batch)
        ]
        outputs.append(runner.run(seqs).clone())
    return outputs


def test_consecutive_steps_wait_for_the_previous_uploads_and_match_the_reference(model):
    runner = make_runner(model)
    event = guarded(runner)
    outputs = decode_steps(runner, 4)
    assert runner.step_modes[GRAPH] == 4
    assert event.records == 5 and event.waits == 4  # every step after the first waited
    batch = prompts()
    for i, prompt in enumerate(batch):
        tokens = prompt + [(13 * step + 7 * i) % 320 for step in range(4)]
        reference = forward_tokens(model, ContiguousCache(model, len(tokens)), tokens, 0)
        got = torch.stack([outputs[0][i]] + [step[i] for step in outputs[1:]])
        torch.testing.assert_close(got, reference[len(prompt) - 1 :], rtol=1e-4, atol=1e-5)


def test_the_checking_event_catches_a_fill_that_does_not_wait(model, monkeypatch):
    runner = make_runner(model)
    guarded(runner)
    decode_steps(runner, 1)
    monkeypatch.setattr(runner.upload_fence, "wait", lambda: None)
    with pytest.raises(AssertionError, match="rewritten before its upload ran"):
        decode_steps(runner, 1)


def test_eager_tree_and_dry_run_steps_are_guarded_too(model):
    """An eager tree step (its masks uploaded with the other inputs), a tree-graph replay and a
    warm-up dry run, one after another, all under the checking event."""
    q = 4
    runner = make_runner(model, tree_query_len=q)
    event = guarded(runner)
    batch = prompts()
    runner.run([SeqInput(p, 0, tables_of(i)) for i, p in enumerate(batch)])
    masks = ancestor_masks([-1, -1, 0], with_root=True)  # root, two children, a grandchild
    mixed = [SeqInput([5, 6, 7, 8], len(batch[0]), tables_of(0), 4, masks)]
    mixed.append(SeqInput(batch[1][:3], 0, tables_of(3), 1))  # a prompt: eager
    runner.run(mixed)
    assert runner.dev["tree_mask"][:4].tolist() == list(masks)
    runner.run([SeqInput([9, 10, 11, 12], len(batch[0]), tables_of(0), 4, masks)])
    runner.dry_run([SeqInput([1, 2], 0, tables_of(1))])
    assert event.records == 4 and event.waits == 3


def test_upload_copies_every_input_of_the_step_in_one_prefix(model):
    """Different table lengths per sequence and two cache groups: one copy of the step buffer's
    prefix lands every input where the kernels read it, and nothing past the prefix moves."""
    runner = make_runner(model)
    seqs = [
        SeqInput([1, 2, 3], 0, ([5], [6])),
        SeqInput([4], 9, ([7, 8, 9], [10, 11, 12])),
        SeqInput([5, 6], 2, ([13], [14])),
    ]
    runner._lay_out(6, 3)
    num_tokens, _, _, _ = runner._fill(seqs)
    runner.inputs.dev_bytes.fill_(0x5A)
    runner._upload()
    # int64 ids, positions, masks and 2 slot rows of 6 tokens; int32 4 + 3 lengths (each field
    # padded to 16 bytes); 3 columns of 2 tables of 3 sequences padded to 16
    prefix = 8 * 5 * 6 + 16 + 16 + 4 * 3 * 2 * 16
    host_bytes, dev_bytes = runner.inputs.host_bytes, runner.inputs.dev_bytes
    assert torch.equal(dev_bytes[:prefix], host_bytes[:prefix])
    assert (dev_bytes[prefix:] == 0x5A).all()
    host, dev = runner.host, runner.dev
    for name in ("input_ids", "positions"):
        assert dev[name][:num_tokens].tolist() == host[name][:num_tokens].tolist()
    assert dev["slot_mapping"][:, :num_tokens].tolist() == host["slot_mapping"][:, :6].tolist()
    assert dev["block_tables"][:, :3, :3].tolist() == host["block_tables"][:, :3, :3].tolist()
    assert dev["block_tables"][1, 1, :3].tolist() == [10, 11, 12]
    assert dev["query_start_loc"][:4].tolist() == [0, 3, 4, 6]
    assert dev["seq_lens"][:3].tolist() == [3, 10, 4]


def test_noise_rows_draw_what_each_generator_draws_alone():
    """One pinned block of rows draws, row by row, what `exponential_noise` draws per row; a
    generator used twice (the shared one) continues its stream."""
    shared, seeded = torch.Generator().manual_seed(4), torch.Generator().manual_seed(5)
    rows = exponential_noise_rows(1000, [shared, seeded, shared], torch.device("cpu"))
    shared_again, seeded_again = torch.Generator().manual_seed(4), torch.Generator().manual_seed(5)
    expected = [
        exponential_noise(1000, shared_again),
        exponential_noise(1000, seeded_again),
        exponential_noise(1000, shared_again),
    ]
    torch.testing.assert_close(rows, torch.stack(expected), rtol=0, atol=0)
