"""ModelRunner.run(device_input_ids=...): decode rows fed from a device tensor (the overlapped
engine step) give the logits of the same rows fed from the host, eagerly and by graph replay."""

from __future__ import annotations

import pytest
import torch

from gossamer.model.loader import load_model
from gossamer.runner import model_runner
from gossamer.runner.model_runner import GRAPH, EagerGraphCapture, ModelRunner, SeqInput
from tests.hf_models import write_hf_model

PLACEHOLDER = 0


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_hf_model(tmp_path_factory.mktemp("device_ids"), seed=23, num_hidden_layers=2)
    return load_model(str(path), dtype="float32").model


def runner_for(model, graphs: bool) -> ModelRunner:
    runner = ModelRunner(
        model, num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=64
    )
    if graphs:
        runner.capture_graphs([1, 2, 4], capture=EagerGraphCapture())
    return runner


def prefill_then_decode(runner: ModelRunner, decode_ids, device_ids=None) -> torch.Tensor:
    """Two prompts, then one decode step of both; returns the decode step's logits."""
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 320, (n,), generator=gen).tolist() for n in (9, 5)]
    tables = [(list(range(1 + 8 * i, 9 + 8 * i)),) * 2 for i in range(2)]
    runner.run([SeqInput(p, 0, t) for p, t in zip(prompts, tables, strict=True)])
    decode = [
        SeqInput([token], len(prompt), table)
        for token, prompt, table in zip(decode_ids, prompts, tables, strict=True)
    ]
    return runner.run(decode, device_input_ids=device_ids).clone()


@pytest.mark.parametrize("graphs", [False, True])
def test_decode_rows_from_a_device_tensor_match_host_ids(model, graphs):
    tokens = [17, 250]
    from_host = prefill_then_decode(runner_for(model, graphs), tokens)
    runner = runner_for(model, graphs)
    device_ids = torch.tensor(tokens, dtype=torch.long, device=model.device)
    from_device = prefill_then_decode(runner, [PLACEHOLDER, PLACEHOLDER], device_ids)
    torch.testing.assert_close(from_device, from_host, rtol=0, atol=0)
    if graphs:
        assert runner.step_modes[GRAPH] == 1
    # the ids serve one step only: the next step feeds its own host ids again
    assert runner._device_input_ids is None


def test_greedy_picks_of_a_graph_step_are_fed_back_in_place(model, monkeypatch):
    """With GREEDY_IN_GRAPH a plain-decode graph leaves each token's greedy pick in
    runner.greedy_ids (last_greedy); fed back as they are, the upload marks those tokens -1 and
    the embedding reads the picks there (no copy into the input buffer): the same logits as the
    picks fed from the host."""
    monkeypatch.setattr(model_runner, "GREEDY_IN_GRAPH", True)
    runner = runner_for(model, graphs=True)
    first = prefill_then_decode(runner, [17, 250])
    picks = runner.last_greedy
    assert picks is not None and torch.equal(picks, first.argmax(dim=-1))
    host_picks = picks.tolist()
    seqs = [SeqInput([PLACEHOLDER], start, table) for start, table in _decode_state()]
    fed = runner.run(seqs, device_input_ids=picks).clone()
    assert (runner.dev["input_ids"][:2] == -1).all()  # read from greedy_ids, not copied
    twin = runner_for(model, graphs=True)
    prefill_then_decode(twin, [17, 250])
    seqs = [SeqInput([token], start, table) for token, (start, table) in
            zip(host_picks, _decode_state(), strict=True)]  # fmt: skip
    torch.testing.assert_close(fed, twin.run(seqs), rtol=0, atol=0)
    assert runner.last_greedy is not None and torch.equal(runner.last_greedy, fed.argmax(dim=-1))
    # an eager step (a prompt) picks nothing
    runner.run([SeqInput([1, 2, 3], 0, ((30, 31), (30, 31)))])
    assert runner.last_greedy is None
    assert twin.num_fed_in_place == 0 and runner.num_fed_in_place == 1
    # off (the default): no pick, and even its own buffer, fed, is copied into the input ids
    monkeypatch.setattr(model_runner, "GREEDY_IN_GRAPH", False)
    plain = runner_for(model, graphs=True)
    prefill_then_decode(plain, [17, 250])
    assert plain.last_greedy is None
    plain.greedy_ids[:2] = torch.tensor(host_picks)
    seqs = [SeqInput([PLACEHOLDER], start, table) for start, table in _decode_state()]
    copied = plain.run(seqs, device_input_ids=plain.greedy_ids[:2])
    torch.testing.assert_close(copied, fed, rtol=0, atol=0)
    assert plain.num_fed_in_place == 0 and plain.dev["input_ids"][:2].tolist() == host_picks


def _decode_state():
    """(start, block tables) of prefill_then_decode's two sequences one step after its decode."""
    tables = [(list(range(1 + 8 * i, 9 + 8 * i)),) * 2 for i in range(2)]
    return [(9 + 1, tables[0]), (5 + 1, tables[1])]
