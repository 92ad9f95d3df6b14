"""benchmarks/spec_decode.py on the CPU: the e2e mode with --tree on tiny models (chain and tree
rows of draft and eagle3), and the suffix-build mode."""

from __future__ import annotations

import json

import pytest

from tests.hf_models import write_hf_model
from tests.spec.checkpoints import write_eagle3_checkpoint


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A 3-layer target (the EAGLE-3 head reads all three layers) and a head for it."""
    target = write_hf_model(tmp_path_factory.mktemp("target"), seed=1)
    head = write_eagle3_checkpoint(
        tmp_path_factory.mktemp("head"),
        vocab_size=320,
        target_hidden_size=64,
        aux_layer_ids=(0, 1, 2),
    )
    return target, head


def test_tree_adds_a_tree_variant_after_each_model_method(benchmark_script):
    bench = benchmark_script("spec_decode")
    args = bench.parse_args(
        ["e2e", "--model", "m", "--draft", "d", "--eagle3", "e", "--num-speculative-tokens", "2"]
        + ["--methods", "none,draft,eagle3", "--tree", "3,2,1"]
    )
    configs = bench.method_configs(args)
    assert list(configs) == ["none", "draft", "draft-tree", "eagle3", "eagle3-tree"]
    for name in ("draft", "eagle3"):
        chain, tree = configs[name], configs[name + "-tree"]
        assert chain.tree is None and chain.num_speculative_tokens == 2
        assert tree.tree.max_depth == 3 and tree.tree.num_nodes == 3 + 6 + 6
        assert tree.num_speculative_tokens == 3  # raised to the tree's depth
        assert tree.model == chain.model
    plain = bench.parse_args(["e2e", "--model", "m", "--draft", "d", "--tree"])
    assert plain.tree == [3, 1, 1, 1]  # the default tree
    assert "draft-tree" in bench.method_configs(plain)
    no_tree = bench.parse_args(["e2e", "--model", "m", "--draft", "d"])
    assert not any(name.endswith("-tree") for name in bench.method_configs(no_tree))


def test_e2e_dry_run_with_trees(benchmark_script, models, tmp_path):
    target, head = models
    out = tmp_path / "e2e.json"
    benchmark_script("spec_decode").main(
        ["e2e", "--model", str(target), "--device", "cpu", "--dtype", "float32"]
        + ["--max-model-len", "256", "--batch-sizes", "2", "--max-tokens", "5"]
        + ["--methods", "none,draft,eagle3", "--draft", str(target), "--eagle3", str(head)]
        + ["--tree", "2,1", "--num-speculative-tokens", "2", "--no-cuda-graphs"]
        + ["--kv-cache-gib", "0.01", "--runs", "2", "--json", str(out)]
    )
    rows = {row["method"]: row for row in json.loads(out.read_text())["rows"]}
    assert list(rows) == ["none", "draft", "draft-tree", "eagle3", "eagle3-tree"]
    assert {row["generated_tokens"] for row in rows.values()} == {20}  # two runs of 2 x 5
    assert {len(row["runs_tokens_per_s"]) for row in rows.values()} == {2}
    assert rows["draft-tree"]["tree_drafts"] > 0 and rows["eagle3-tree"]["tree_drafts"] > 0
    assert rows["draft"]["tree_drafts"] == rows["eagle3"]["tree_drafts"] == 0
    # the target drafting for itself: every path accepted to its depth (2)
    assert rows["draft-tree"]["mean_accepted_length"] > 2


def test_e2e_interleaved_runs(benchmark_script, models, tmp_path, capsys):
    """--interleave: every method's engine first, then the runs in turn; the rows are as without
    it (per batch size, none first, each run's tokens counted once)."""
    target, _ = models
    out = tmp_path / "e2e.json"
    benchmark_script("spec_decode").main(
        ["e2e", "--model", str(target), "--device", "cpu", "--dtype", "float32"]
        + ["--max-model-len", "256", "--batch-sizes", "1,2", "--max-tokens", "4"]
        + ["--methods", "none,ngram", "--no-cuda-graphs", "--kv-cache-gib", "0.01"]
        + ["--runs", "2", "--interleave", "--profile", "--json", str(out)]
    )
    assert "none at batch 1: host profile over ~8 steps" in capsys.readouterr().out  # --profile
    rows = json.loads(out.read_text())["rows"]
    assert [(row["method"], row["batch"]) for row in rows] == [
        ("none", 1), ("ngram", 1), ("none", 2), ("ngram", 2)
    ]  # fmt: skip
    assert [row["generated_tokens"] for row in rows] == [8, 8, 16, 16]
    assert all(len(row["runs_tokens_per_s"]) == 2 for row in rows)
    assert rows[0]["speedup"] == rows[2]["speedup"] == 1.0


def test_suffix_build_mode(benchmark_script, tmp_path):
    out = tmp_path / "suffix.json"
    benchmark_script("spec_decode").main(
        ["suffix-build", "--prompt-lengths", "64,512", "--repeats", "1"]
        + ["--suffix-steps", "5", "--json", str(out)]
    )
    rows = json.loads(out.read_text())["rows"]
    assert [row["prompt_tokens"] for row in rows] == [64, 512]
    assert all(row["first_proposal_ms"] > 0 and row["step_us"] > 0 for row in rows)


def test_e2e_and_verify_cost_need_a_model(benchmark_script):
    bench = benchmark_script("spec_decode")
    with pytest.raises(SystemExit):
        bench.parse_args(["e2e"])


def test_auto_decides_with_a_measured_cost_table(benchmark_script, tmp_path):
    path = tmp_path / "costs.json"  # as verify-cost --cost-table writes it
    path.write_text(json.dumps({"model": "m", "cost_table": {"1": {"0": 2.0, "1": 2.5}}}))
    bench = benchmark_script("spec_decode")
    args = bench.parse_args(["e2e", "--model", "m", "--auto-cost-table", str(path)])
    assert bench.method_configs(args)["auto"].cost_table == ((1, ((0, 2.0), (1, 2.5))),)
    default = bench.method_configs(bench.parse_args(["e2e", "--model", "m"]))["auto"]
    assert default.cost_table is None


def test_e2e_auto_times_its_step_costs_where_graphs_exist(
    benchmark_script, models, tmp_path, monkeypatch, capsys
):
    """The lead's H200 command (`e2e --methods none,auto`) on the CPU, with graphs captured
    eagerly (EagerGraphCapture) so that the engine's start-up calibration runs as on the GPU:
    auto decides with the table it timed; auto-fixed (the built-in table, host time free) does
    not time one."""
    from gossamer.runner import model_runner

    monkeypatch.setattr(model_runner, "graphs_possible", lambda model, cuda_graphs: cuda_graphs)
    monkeypatch.setattr(model_runner, "GraphCapture", model_runner.EagerGraphCapture)
    target, _ = models
    out = tmp_path / "e2e.json"
    benchmark_script("spec_decode").main(
        ["e2e", "--model", str(target), "--device", "cpu", "--dtype", "float32"]
        + ["--max-model-len", "256", "--batch-sizes", "1,2", "--max-tokens", "6"]
        + ["--methods", "none,auto,auto-fixed", "--kv-cache-gib", "0.01", "--json", str(out)]
    )
    rows = json.loads(out.read_text())["rows"]
    assert [(row["method"], row["batch"]) for row in rows] == [
        (method, batch) for method in ("none", "auto", "auto-fixed") for batch in (1, 2)
    ]
    auto = [row for row in rows if row["method"] == "auto"]
    assert all(row["measured_cost_table"].startswith("{1: {0: ") for row in auto)
    assert all(row["cost_times"]["cost_plain_step_us"] > 0 for row in auto)
    fixed = [row for row in rows if row["method"] == "auto-fixed"]
    assert all(row["measured_cost_table"] is None for row in fixed)
    assert "auto: step costs timed at start-up" in capsys.readouterr().out
    assert {row["generated_tokens"] for row in rows} == {6, 12}


def test_auto_fixed_is_the_former_auto(benchmark_script):
    bench = benchmark_script("spec_decode")
    configs = bench.method_configs(bench.parse_args(["e2e", "--model", "m"]))
    assert "auto-fixed" not in configs  # only when asked for
    args = bench.parse_args(["e2e", "--model", "m", "--methods", "auto,auto-fixed"])
    auto, fixed = bench.method_configs(args).values()
    assert auto.cost_table is None and auto.charge_proposer_time
    assert fixed.cost_table is not None and not fixed.charge_proposer_time
