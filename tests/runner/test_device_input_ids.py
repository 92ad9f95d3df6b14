"""ModelRunner.run(device_input_ids=...): decode rows fed from a device tensor (the overlapped
engine step) give the logits of the same rows fed from the host, eagerly and by graph replay."""

from __future__ import annotations

import pytest
import torch

from gossamer.model.loader import load_model
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
