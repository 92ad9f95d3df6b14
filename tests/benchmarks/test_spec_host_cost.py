"""benchmarks/spec_host_cost.py: its oracle model makes greedy decoding reproduce each request's
text (so drafts are judged against it), and a small run reports every method and batch."""

from __future__ import annotations

import argparse
import json
import sys

from gossamer.spec.config import SpecConfig


def _args(**overrides) -> argparse.Namespace:
    args = dict(
        prompt_tokens=96,
        max_tokens=24,
        k=4,
        vocab=200,
        phrases=40,
        copy_prob=0.5,
        seed=0,
        max_model_len=512,
        device_ms_scale=0.0,
        verify_device_scale=1.0,
        async_scheduling=True,
        clock="cpu",
    )
    return argparse.Namespace(**(args | overrides))


def test_the_oracle_engine_decodes_each_request_s_text(benchmark_script):
    bench = benchmark_script("spec_host_cost")
    args = _args()
    spec = SpecConfig(method="ngram", num_speculative_tokens=args.k)
    engine, model, prompts = bench.oracle_engine(args, spec, batch=3)
    prompt_list = prompts(7)
    texts = bench.make_texts(args, 3, 7)
    params = bench.SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    for index, prompt in enumerate(prompt_list):
        engine.add_request(str(index), prompt, params)
    outputs: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
    for index, text in enumerate(texts):
        expected = text[args.prompt_tokens : args.prompt_tokens + args.max_tokens]
        assert outputs[str(index)] == expected
    assert engine.stats.spec_stats["num_accepted_tokens"] > 0  # drafts were judged and kept


def test_a_small_run_reports_every_method_and_batch(benchmark_script, tmp_path, monkeypatch):
    path = tmp_path / "host.json"
    argv = [
        "spec_host_cost.py",
        "--batch-sizes",
        "1,2",
        "--prompt-tokens",
        "128",
        "--max-tokens",
        "16",
        "--repeats",
        "1",
        "--device-ms-scale",
        "0",
        "--breakdown",
        "--json",
        str(path),
    ]
    monkeypatch.setattr(sys, "argv", argv)
    benchmark_script("spec_host_cost").main()
    rows = json.loads(path.read_text())["rows"]
    assert [(row["method"], row["batch"]) for row in rows] == [
        (method, batch) for batch in (1, 2) for method in ("none", "ngram", "suffix", "auto")
    ]
    for row in rows:
        assert row["steps"] > 0 and row["host_ms_mean"] > 0
        assert row["tokens"] == 16 * row["batch"] - row["batch"]  # the first came with the prompt
        if row["method"] == "none":
            assert row["spec_steps"] == 0
        assert "runner.run (less forward)" in row["parts_ms_per_step"]
    assert any(row["spec_steps"] for row in rows if row["method"] == "ngram")
