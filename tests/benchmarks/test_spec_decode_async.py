"""benchmarks/spec_decode.py e2e runs every method, "none" included, with overlapped scheduling
by default (as `gossamer serve`), so that speedups are against the default serving engine;
--no-async-scheduling gives synchronous steps. The setting is in the header and the JSON."""

from __future__ import annotations

import json

from tests.hf_models import write_hf_model


def test_async_scheduling_is_on_unless_told_not_to(benchmark_script):
    bench = benchmark_script("spec_decode")
    assert bench.parse_args(["e2e", "--model", "m"]).async_scheduling
    assert not bench.parse_args(["e2e", "--model", "m", "--no-async-scheduling"]).async_scheduling


def test_e2e_rows_count_their_overlapped_steps(benchmark_script, tmp_path, capsys):
    model = write_hf_model(tmp_path / "model", seed=3, num_hidden_layers=1)
    results = {}
    for flag in ("--async-scheduling", "--no-async-scheduling"):
        out = tmp_path / f"{flag}.json"
        benchmark_script("spec_decode").main(
            ["e2e", "--model", str(model), "--device", "cpu", "--dtype", "float32"]
            + ["--max-model-len", "256", "--batch-sizes", "2", "--max-tokens", "8"]
            + ["--methods", "none,ngram", "--no-cuda-graphs", "--kv-cache-gib", "0.01"]
            + ["--json", str(out), flag]
        )
        results[flag] = json.loads(out.read_text())
        assert f"async scheduling: {'off' if 'no' in flag else 'on'}" in capsys.readouterr().out
    overlapped = results["--async-scheduling"]
    assert overlapped["async_scheduling"] is True
    rows = {row["method"]: row for row in overlapped["rows"]}
    assert rows["none"]["overlapped_steps"] > 0  # the baseline is the overlapped engine
    synchronous = results["--no-async-scheduling"]
    assert synchronous["async_scheduling"] is False
    assert all(row["overlapped_steps"] == 0 for row in synchronous["rows"])
