"""benchmarks/kv_cache_accuracy.py on the CPU: the built-in model over a float32 and an fp8 cache."""

from __future__ import annotations

import json


def test_fp8_cache_moves_the_scores_a_little(benchmark_script, tmp_path):
    path = tmp_path / "accuracy.json"
    flags = ["--window", "96", "--windows", "2", "--chunk", "16", "--json", str(path)]
    benchmark_script("kv_cache_accuracy").main(flags)
    exact, fp8 = json.loads(path.read_text())["results"]
    assert (exact["cache_dtype"], fp8["cache_dtype"]) == ("float32", "fp8_e4m3")
    assert exact["tokens"] == fp8["tokens"] == 2 * 95
    assert exact["top1_agreement"] == 1.0 and exact["max_logprob_change"] == 0.0
    assert 0.0 < fp8["max_logprob_change"]  # the cache really is rounded
    assert fp8["top1_agreement"] > 0.8
    assert abs(fp8["mean_nll"] - exact["mean_nll"]) < 0.05 * exact["mean_nll"]
