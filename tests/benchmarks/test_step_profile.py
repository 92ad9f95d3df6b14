"""benchmarks/step_profile.py: the per-kernel table, and a --smoke run on the CPU."""

from __future__ import annotations

import json

import pytest


def test_kernel_table_groups_by_name_per_step_and_per_layer(benchmark_script):
    bench = benchmark_script("step_profile")
    prof = bench.Profile(
        kernels=[("gemv", 10.0), ("attn", 5.0), ("gemv", 20.0), ("attn", 7.0)],
        copies=[("Memcpy HtoD (Pageable -> Device)", 2.0)],
        steps=2,
    )
    rows = bench.kernel_table(prof, num_layers=4, step_us=100.0)
    assert [row.name for row in rows] == ["gemv", "attn", "Memcpy HtoD (Pageable -> Device)"]
    gemv = rows[0]
    assert gemv.calls_per_step == 1 and gemv.calls_per_layer == 0.25
    assert gemv.us_per_call == 15 and gemv.us_per_step == 15 and gemv.us_per_layer == 3.75
    assert gemv.share_of_step == pytest.approx(0.15)
    assert prof.per_step(prof.kernels) == (2, 21)


def test_smoke_profile_accounts_for_the_whole_step(benchmark_script, tmp_path):
    path = tmp_path / "profile.json"
    benchmark_script("step_profile").main(["--smoke", "--json", str(path)])
    profiles = json.loads(path.read_text())["profiles"]
    assert [p["batch"] for p in profiles] == [1, 2]
    for p in profiles:
        kernels = p["kernels"]
        assert kernels and p["launches_per_step"] > 0
        per_step = [k["us_per_step"] for k in kernels]
        assert per_step == sorted(per_step, reverse=True)
        assert sum(per_step) == pytest.approx(p["kernel_us_per_step"] + p["copy_us_per_step"])
        assert sum(k["calls_per_step"] for k in kernels) == pytest.approx(
            p["launches_per_step"] + p["copies_per_step"]
        )
        assert p["gaps_and_host_us"] == pytest.approx(
            p["step_us"] - p["kernel_us_per_step"] - p["copy_us_per_step"]
        )
        for k in kernels:
            assert k["calls_per_layer"] == pytest.approx(k["calls_per_step"] / p["num_layers"])
            assert k["share_of_step"] == pytest.approx(k["us_per_step"] / p["step_us"])
        # the unembedding is one matrix product per step, whatever the batch
        assert any(k["name"] == "aten::mm" and k["calls_per_step"] == 1 for k in kernels)
        assert p["graph_profile"] is None  # no graphs on a CPU


def test_smoke_profile_over_an_fp8_cache(benchmark_script, tmp_path):
    path = tmp_path / "profile.json"
    flags = ["--smoke", "--batch-sizes", "2", "--kv-cache-dtype", "fp8", "--json", str(path)]
    benchmark_script("step_profile").main(flags)
    record = json.loads(path.read_text())
    assert [p["batch"] for p in record["profiles"]] == [2]
    assert record["profiles"][0]["kernels"]


def test_prefill_shapes_parse_and_bad_ones_say_what_is_wanted(benchmark_script):
    bench = benchmark_script("step_profile")
    assert bench.parse_prefill("8x1024,1x8192") == [(8, 1024), (1, 8192)]
    assert bench.parse_prefill("") == []
    for bad in ("8", "0x16", "8x", "ax16"):
        with pytest.raises(ValueError, match="PROMPTSxTOKENS"):
            bench.parse_prefill(bad)


def test_prefill_flops_count_each_matmul_once(benchmark_script):
    from gossamer.config import ModelConfig

    cfg = ModelConfig(
        num_hidden_layers=2, hidden_size=8, num_attention_heads=2, num_key_value_heads=1,
        head_dim=4, intermediate_size=6, num_local_experts=5, num_experts_per_tok=2,
        vocab_size=10, sliding_window=2, layer_types=("sliding_attention", "full_attention"),
    )  # fmt: skip
    # 2 prompts of 3 tokens: projections 8*(2+2)*4 + 2*4*8 = 192, router 40, experts 2*3*8*6 = 288
    per_token_layer = 192 + 40 + 288
    keys = (1 + 2 + 2) + (1 + 2 + 3)  # sliding window 2, then causal over 3 positions
    expected = 2 * 6 * 2 * per_token_layer + 4 * 2 * 4 * keys * 2 + 2 * 2 * 8 * 10
    assert benchmark_script("step_profile").prefill_flops(cfg, 2, 3) == expected


def test_smoke_prefill_profile(benchmark_script, tmp_path):
    path = tmp_path / "profile.json"
    benchmark_script("step_profile").main(["--smoke", "--prefill", "2x12", "--json", str(path)])
    (profile,) = json.loads(path.read_text())["profiles"]  # prefill alone: no decode batches
    assert profile["step_timing"] == "eager prefill"
    assert profile["batch"] == 2 and profile["prefill_tokens"] == 24
    assert profile["kernels"] and profile["matmul_tflop"] > 0
    assert profile["tflops"] == pytest.approx(profile["matmul_tflop"] * 1e6 / profile["step_us"])
