"""benchmarks/guard_accounting.py: the guard's cycles tile the run's wall time, each with a verdict,
and a small run on the oracle reports them."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from gossamer.spec.guard import REPAY_MAX_BACKOFF

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "guard_accounting.py"
SMALL = ["--prompt-tokens", "96", "--max-tokens", "40", "--vocab", "200", "--phrases", "40"]
SMALL += ["--max-model-len", "512", "--device-ms-scale", "0.2"]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("guard_accounting_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_cycles_add_up_to_the_run(bench):
    # The timed batch goes on with the guard of the warm-up batch, in whatever window wall time
    # left it. With explore_every 1 a kept window lasts at most REPAY_MAX_BACKOFF (32) steps and
    # samples its last PLAIN_TAIL x explore_steps of them, so some of the 39 decode steps are
    # sampled however slow the machine is (explore_every 4 allowed 128: 1-2 runs in 40 on a loaded
    # CPU sampled nothing).
    spec = '{"method": "auto", "explore_steps": 2, "explore_every": 1}'
    assert REPAY_MAX_BACKOFF * 1 + 2 < 40  # a kept window and an exploration fit in the run
    args = bench.parse_args([*SMALL, "--spec-config", spec])
    run = bench.measure(args, bench.parse_spec_config(args.spec_config), batch=3)
    account = bench.books(run)
    assert run.tokens == 3 * 40 and run.cycles
    assert len(run.finished_at) == 3 and max(run.finished_at) <= run.seconds
    tallied = sum(window.seconds for window in account.by_verdict.values())
    assert tallied == pytest.approx(run.seconds, rel=1e-6)
    verdicts = set(account.by_verdict)
    assert "prompt chunk" in verdicts and any(v.startswith("sampled") for v in verdicts)
    # every decode cycle belongs to a bucket and mode; what the guard sampled is part of it
    for key, sampled in account.sampled.items():
        assert sampled.num_steps <= account.delivered[key].num_steps
    assert "guard_b4_speculating" in run.guard_stats


def test_the_oracle_texts_mix_what_requests_accept(bench):
    args = bench.parse_args([*SMALL, "--output-copy-probs", "1.0,0.0"])
    texts = bench.oracle_texts(args, 2, seed=5)
    prompt = args.prompt_tokens
    assert texts[0][:prompt] != texts[1][:prompt]
    assert all(len(text) == prompt + args.max_tokens + 2 * args.k + 2 for text in texts)


def test_a_small_run_prints_and_writes_its_books(bench, tmp_path, capsys):
    out = tmp_path / "books.json"
    threads = torch.get_num_threads()
    try:
        bench.main([*SMALL, "--batch-sizes", "2", "--json", str(out)])
    finally:
        torch.set_num_threads(threads)  # main() keeps the oracle's tiny tensors on one thread
    printed = capsys.readouterr().out
    assert "where the time went" in printed and "by batch size" in printed
    assert "requests finished, guarded" in printed
    result = json.loads(out.read_text())
    (row,) = result["runs"]
    assert row["batch"] == 2 and row["tokens"] == 80 and row["none"]["tokens"] == 80
    assert row["by_verdict"] and row["delivered"]
    assert len(row["finished_at"]) == 2 and len(row["none"]["finished_at"]) == 2


def test_rounds_of_new_batches_run_on_one_engine(bench, capsys):
    """`--rounds`: timed batches of new requests on the guarded engine (a server's stream), each
    with its own books and set against none's batch of the same round, then the medians."""
    threads = torch.get_num_threads()
    try:
        bench.main([*SMALL, "--batch-sizes", "2", "--rounds", "2"])
    finally:
        torch.set_num_threads(threads)
    printed = capsys.readouterr().out
    assert "round 1)" in printed and "round 2)" in printed
    assert "== batch 2, 2 rounds: guarded/none" in printed
    assert "median of the rounds" in printed and "of the speeds" in printed


def test_engines_take_turns_in_alternating_order(bench, monkeypatch):
    """Rounds interleave the engines A B, B A, A B: each round's pair ran at nearly the same
    moment, and neither engine always runs first (after the other's batch)."""
    order = []
    run_batch = bench.run_batch

    def recording(engine, prompts, max_tokens):
        order.append("spec" if engine.speculator is not None else "none")
        return run_batch(engine, prompts, max_tokens)

    monkeypatch.setattr(bench, "run_batch", recording)
    args = bench.parse_args([*SMALL, "--batch-sizes", "2"])
    plain, guarded = bench.measure_interleaved(args, [None, bench.parse_spec_config("auto")], 2, 3)
    assert order[:2] == ["none", "spec"]  # the warm-up batches
    assert order[2:] == ["none", "spec", "spec", "none", "none", "spec"]
    assert len(plain) == len(guarded) == 3 and all(run.tokens == 2 * 40 for run in plain)
