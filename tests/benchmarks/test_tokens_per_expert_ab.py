"""benchmarks/tokens_per_expert_ab.py: the crafted routings and the split's pricing (GPU timing
not run)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture
def script(benchmark_script, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    module = benchmark_script("tokens_per_expert_ab")
    monkeypatch.setattr(module, "DEVICE", "cpu")
    return module


@pytest.mark.parametrize("per_expert", [1, 2, 3])
def test_every_expert_gets_exactly_n_tokens(script, per_expert):
    calls = script.even_calls(per_expert, calls=3, seed=0)
    for call, (x, logits) in enumerate(calls):
        assert x.shape == (32 * per_expert, script.HIDDEN)
        assert script.counts_per_expert(logits) == [per_expert] * script.EXPERTS
        # a token's experts are distinct, strongest first, and shift with the call
        top = torch.topk(logits.float(), script.TOP_K, dim=-1).indices
        assert top[0].tolist() == [call, call + 1, call + 2, call + 3]


def test_the_split_prices_each_busy_expert_on_its_cheaper_path(script):
    rows = []
    for n, v2_us, gemv_us in [(1, 128.0, 64.0), (3, 128.0, 256.0)]:  # us a layer of 128 experts
        for us_v2, us_gemv in [(v2_us, gemv_us), (v2_us + 12.8, gemv_us + 12.8)]:  # 2 rounds
            rows.append({"path": "v2", "per_expert": n, "us": us_v2})
            rows.append({"path": "grouped_gemv", "per_expert": n, "us": us_gemv})
    rows.append({"path": "v2", "per_expert": 0, "us": 1e9})  # random rows are not prices
    # five experts with one token, two with two (priced as one: none measured at two), one with three
    logits = torch.full((3, 8), -1.0)
    logits[0, [0, 2, 3, 4]] = 1.0
    logits[1, [1, 2, 5, 6]] = 1.0
    logits[2, [2, 3, 4, 7]] = 1.0
    estimate = script.split_estimate(rows, [logits])
    # medians a busy expert: v2 1.05 at n = 1 and 3; the GEMV 0.55 at 1, 2.05 at 3
    counts = sorted(script.counts_per_expert(logits))
    assert counts == [1, 1, 1, 1, 1, 2, 2, 3]
    assert estimate["v2_us"] == pytest.approx(8 * 1.05)
    assert estimate["split_us"] == pytest.approx(7 * 0.55 + 1 * 1.05)
