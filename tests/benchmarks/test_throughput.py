"""benchmarks/throughput.py --smoke: the built-in model on the CPU, C = 2 and 4."""

from __future__ import annotations

import json

import pytest
import torch

FIELDS = {
    "concurrency",
    "mode",
    "wall_s",
    "output_tokens",
    "output_tok_per_s",
    "mean_ttft_ms",
    "mean_tpot_ms",
    "preemptions",
    "prefill_share",
    "decode_share",
    "mean_decode_step_ms",
    "floor_ms",
    "kv_fits",
}


def run(benchmark_script, tmp_path, *flags: str) -> dict:
    path = tmp_path / "throughput.json"
    benchmark_script("throughput").main(["--smoke", "--json", str(path), *flags])
    return json.loads(path.read_text())


def test_smoke_run_counts_every_token_and_splits_prefill_from_decode(benchmark_script, tmp_path):
    result = run(benchmark_script, tmp_path)
    (model,) = result["models"]
    rows = model["rows"]
    assert [row["concurrency"] for row in rows] == [2, 4]
    for row in rows:
        assert FIELDS <= row.keys()
        assert row["output_tokens"] == row["concurrency"] * row["output_len"]
        assert row["output_tok_per_s"] == pytest.approx(row["output_tokens"] / row["wall_s"])
        # every short prompt fits one step's budget: one prefill step, then one decode per token
        assert (row["prefill_steps"], row["decode_steps"]) == (1, row["output_len"] - 1)
        assert row["prefill_share"] + row["decode_share"] == pytest.approx(1)
        assert row["mean_decode_step_ms"] == pytest.approx(
            1e3 * row["decode_s"] / row["decode_steps"]
        )
        assert 0 < row["mean_ttft_ms"] <= row["max_ttft_ms"] <= 1e3 * row["wall_s"]
        assert row["mean_tpot_ms"] > 0
        assert row["prefix_cache_hit_tokens"] == 0  # distinct prompts, warm-up included
        assert row["preemptions"] == 0 and row["kv_fits"]
        assert row["floor_ms"] is None  # no GPU, no copy bandwidth


def test_a_cache_too_small_for_the_batch_is_reported_and_still_finishes(benchmark_script, tmp_path):
    # 10 blocks (and a half) of the mini model's float32 KV (3 layers x K,V x 16 x 64 x 4 bytes): 4 requests
    # of 30 tokens need 16 at once, so some wait for others to finish
    block = 3 * 2 * 16 * 64 * 4
    result = run(
        benchmark_script,
        tmp_path,
        "--concurrency",
        "4",
        "--kv-cache-gib",
        str(10.5 * block / 2**30),
    )
    (row,) = result["models"][0]["rows"]
    assert row["kv_blocks"] == 9 and row["kv_blocks_needed"] == 16
    assert not row["kv_fits"]
    assert row["output_tokens"] == 4 * row["output_len"]
    assert row["prefill_steps"] > 1  # the waiting requests were admitted later


def test_closed_loop_keeps_c_users_busy_until_every_request_is_done(benchmark_script, tmp_path):
    result = run(benchmark_script, tmp_path, "--concurrency", "2", "--requests-per-user", "3")
    assert result["mode"].startswith("closed loop")
    (row,) = result["models"][0]["rows"]
    assert row["mode"].startswith("closed loop") and row["concurrency"] == 2
    assert row["output_tokens"] == 6 * row["output_len"]  # 2 users x 3 requests each
    assert row["prefill_steps"] >= 3  # the later prompts were admitted as earlier ones finished
    # time to first token counts from each request's own submission: never the whole wall time
    assert 0 < row["mean_ttft_ms"] <= row["max_ttft_ms"] < 1e3 * row["wall_s"] / 2
    assert row["prefix_cache_hit_tokens"] == 0 and row["preemptions"] == 0


def test_closed_loop_never_has_more_than_c_requests_in_flight(benchmark_script):
    throughput = benchmark_script("throughput")
    args = throughput.parse_args(["--smoke", "--concurrency", "3"])
    engine = throughput.build_engine(args.models[0], args)
    prompts = throughput.random_prompts(torch.Generator().manual_seed(1), 7, 8, 100)
    log = throughput.run_batch(engine, prompts, 4, users=3)
    assert sorted(log.tokens.values()) == [4] * 7
    for submitted in log.submitted.values():  # requests submitted before t and not done at t
        in_flight = [
            rid for rid, start in log.submitted.items() if start <= submitted < log.last_token[rid]
        ]
        assert len(in_flight) <= 3
    assert sum(start > 0 for start in log.submitted.values()) == 4  # refills after finishes
