from __future__ import annotations

import pytest
import torch

from gossamer.runner.sampler import Sampler, SamplingRow
from gossamer.sampling_params import SamplingParams, SamplingParamsError


def row(params: SamplingParams, output=(), prompt=(), seed=None, stop=()) -> SamplingRow:
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    return SamplingRow(params, list(prompt), list(output), generator, stop)


def draws(logits: torch.Tensor, params: SamplingParams, count: int) -> torch.Tensor:
    sampler = Sampler(seed=0)
    batch = logits.expand(count, -1)
    return torch.tensor(sampler.sample(batch, [row(params)] * count).token_ids)


def test_greedy_is_argmax():
    logits = torch.randn(5, 50)
    result = Sampler().sample(logits, [row(SamplingParams(temperature=0))] * 5)
    assert result.token_ids == logits.argmax(-1).tolist()


def test_temperature_one_follows_the_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]])
    tokens = draws(logits, SamplingParams(temperature=1.0), 20000)
    freq = torch.bincount(tokens, minlength=5).float() / len(tokens)
    total_variation = 0.5 * (freq - torch.softmax(logits[0], -1)).abs().sum()
    assert total_variation < 0.02  # a wrong temperature or a biased draw is far above this


def test_top_k_top_p_min_p_exclude_tokens():
    logits = torch.tensor([[3.0, 2.9, 2.8, 0.0, -1.0, -2.0]])
    assert set(draws(logits, SamplingParams(top_k=2), 2000).tolist()) == {0, 1}
    # probabilities ~[.35,.32,.29,.02,...]: top_p 0.6 keeps tokens 0 and 1 only
    assert set(draws(logits, SamplingParams(top_p=0.6), 2000).tolist()) == {0, 1}
    assert set(draws(logits, SamplingParams(min_p=0.5), 2000).tolist()) == {0, 1, 2}


def test_seeded_request_is_independent_of_batch_company():
    torch.manual_seed(0)
    logits = torch.randn(4, 100)
    params = SamplingParams(temperature=0.8, seed=7)
    alone = [Sampler(1).sample(logits[2:3], [row(params, seed=7)]).token_ids[0] for _ in range(3)]
    crowd = [
        row(SamplingParams(temperature=1.0)),
        row(SamplingParams(temperature=0)),
        row(params, seed=7),
        row(SamplingParams(temperature=2.0, seed=3), seed=3),
    ]
    in_batch = Sampler(99).sample(logits, crowd).token_ids[2]
    assert alone[0] == in_batch == alone[1]


def test_penalties_follow_the_documented_formulas():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.4]])
    params = SamplingParams(
        temperature=0, repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25
    )
    sampler = Sampler()
    r = row(params, output=[0, 0, 1], prompt=[2])
    processed = logits.clone()[0]
    from gossamer.runner.sampler import _apply_penalties

    _apply_penalties(processed, r)
    expected = torch.tensor([2.0 / 2 - 0.5 * 2 - 0.25, -2.0 * 2 - 0.5 - 0.25, 1.0 / 2, 0.4])
    assert torch.allclose(processed, expected)
    assert sampler.sample(logits, [r]).token_ids == [2]  # token 0 fell from first to last


def test_min_tokens_bans_stop_tokens_until_reached():
    logits = torch.tensor([[0.0, 10.0, 1.0]])  # token 1 is eos and the favourite
    params = SamplingParams(temperature=0, min_tokens=2)
    assert Sampler().sample(logits, [row(params, output=[2], stop=(1,))]).token_ids == [2]
    assert Sampler().sample(logits, [row(params, output=[2, 2], stop=(1,))]).token_ids == [1]


def test_logprobs_report_the_raw_distribution():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    params = SamplingParams(temperature=0, logprobs=2, presence_penalty=1.0)
    result = Sampler().sample(logits, [row(params, output=[1])])
    entry = result.logprobs[0]
    log_probs = torch.log_softmax(logits[0], -1)
    assert entry.token_id == result.token_ids[0]
    assert entry.logprob == pytest.approx(float(log_probs[entry.token_id]))
    assert [t for t, _ in entry.top] == [1, 2]


@pytest.mark.parametrize(
    "kwargs,param",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"logprobs": 21}, "logprobs"),
    ],
)
def test_invalid_params_name_the_parameter(kwargs, param):
    with pytest.raises(SamplingParamsError) as info:
        SamplingParams(**kwargs)
    assert info.value.param == param
