"""benchmarks/upload_cost.py on the CPU: both upload ways run and land the same bytes of a step's
inputs where its kernels read them, and the report has a row per batch size."""

from __future__ import annotations

import json
import sys

import torch


def test_both_ways_upload_the_step_and_the_report_has_every_batch(
    benchmark_script, tmp_path, monkeypatch
):
    bench = benchmark_script("upload_cost")
    cpu = torch.device("cpu")
    old = bench.PerInputUploads(16, 4, 8, cpu)
    old.pinned["input_ids"][:3] = torch.tensor([5, 6, 7])
    old.pinned["block_tables"][1, 2, :2] = torch.tensor([9, 10])
    old.upload(3, 4, 2)
    assert old.dev["input_ids"][:3].tolist() == [5, 6, 7]
    assert old.dev["block_tables"][1, 2, :2].tolist() == [9, 10]
    out = tmp_path / "upload.json"
    argv = ["upload_cost.py", "--device", "cpu", "--batch-sizes", "1,4", "--rounds", "1"]
    argv += ["--calls", "3", "--max-tokens", "16", "--max-seqs", "4", "--max-model-len", "256"]
    monkeypatch.setattr(sys, "argv", [*argv, "--context", "64", "--json", str(out)])
    bench.main()
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert [row["batch"] for row in rows] == [1, 4]
    assert all(row["per_input_us"] > 0 and row["one_copy_us"] > 0 for row in rows)
    assert set(report["advance"]) == {"advance_views_kept_us", "advance_views_carved_us"}
    assert all(us > 0 for us in report["advance"].values())
