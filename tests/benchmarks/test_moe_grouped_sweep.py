"""benchmarks/moe_grouped_sweep.py --block-ms: every tile shape at every token count (GPU-only
timing stubbed out)."""

from __future__ import annotations

import argparse
from pathlib import Path


def test_block_m_rows_try_each_shape_at_each_token_count(benchmark_script, monkeypatch):
    # the script imports its neighbours (kernels_moe, timing) as run from benchmarks/
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    sweep = benchmark_script("moe_grouped_sweep")
    timed = []

    def fake_time_layer(experts, tokens, gate_up, down, bandwidth, block_m):
        if block_m == 128 and gate_up.get("maxnreg") is None:
            raise RuntimeError("out of resource")  # a failed compile is reported, not fatal
        timed.append((tokens, block_m, gate_up["num_warps"], gate_up.get("maxnreg"),
                      down.get("maxnreg")))  # fmt: skip
        return {"tokens": tokens, "us": 1.0}

    monkeypatch.setattr(sweep, "time_layer", fake_time_layer)
    monkeypatch.setattr(sweep, "_print", lambda row, name: None)
    args = argparse.Namespace(
        tokens=8192, confirm="4096", block_ms="64,128", warps="8", maxnregs="0,128"
    )
    rows = sweep.block_m_rows(None, args, 1.0)
    assert timed == [
        (8192, 64, 8, None, None), (8192, 64, 8, 128, 128), (8192, 128, 8, 128, 128),
        (4096, 64, 8, None, None), (4096, 64, 8, 128, 128), (4096, 128, 8, 128, 128),
    ]  # fmt: skip
    assert [row["maxnreg"] for row in rows] == [0, 128, 128, 0, 128, 128]
