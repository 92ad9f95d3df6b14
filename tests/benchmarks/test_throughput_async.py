"""benchmarks/throughput.py --smoke --async-scheduling: the engine's overlapped decode steps."""

from __future__ import annotations

import json


def test_async_scheduling_counts_every_token_and_overlaps_the_decode_steps(
    benchmark_script, tmp_path
):
    path = tmp_path / "throughput.json"
    benchmark_script("throughput").main(["--smoke", "--async-scheduling", "--json", str(path)])
    (model,) = json.loads(path.read_text())["models"]
    for row in model["rows"]:
        assert row["async_scheduling"]
        assert row["output_tokens"] == row["concurrency"] * row["output_len"]
        assert (row["prefill_steps"], row["decode_steps"]) == (1, row["output_len"] - 1)
        # every decode step but the first was launched before the previous one's tokens came,
        # and so was one step past the last token (computed, then dropped)
        assert row["overlapped_steps"] == row["output_len"] - 1
