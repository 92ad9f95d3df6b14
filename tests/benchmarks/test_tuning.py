"""benchmarks/tuning.py: a sweep's JSON -> the GEMV's configs and row limits."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

import pytest

from tests.benchmarks.conftest import BENCHMARKS

WIDE_SWEEP = BENCHMARKS / "runs" / "results" / "session26_call3" / "gemv_wide.json"


@pytest.fixture
def tuning(benchmark_script, monkeypatch):
    """The script as a module; its `gemv` is gossamer.kernels.gemv, with the globals the script
    sets restored after the test. NOTE: no kernel module is imported at the top of this file:
    at collection, before tests/kernels/conftest.py, that would import Triton compiled and break
    the interpreted kernels of every later CPU test."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    module = benchmark_script("tuning")
    gemv = module.gemv
    for name in ("CONFIGS", "CLASS_MAX_M", "GEMV_MAX_M"):
        value = getattr(gemv, name)
        monkeypatch.setattr(gemv, name, dict(value) if isinstance(value, dict) else value)
    yield module
    for name in ("gemv_sweep", "kernels_small", "timing"):
        sys.modules.pop(name, None)


def test_a_wide_sweep_gives_the_defaults_it_measured(tuning):
    """Session 26's --wide sweep (H100) applied: the "_wide" configs and per-class row limits in
    gemv.py's source are what it picks, so a run without the file measures the same code."""
    gemv = tuning.gemv
    defaults = {
        key: asdict(gemv.CONFIGS[key]) for key in ("narrow_wide", "medium_wide", "tall_wide")
    }
    class_max_m, gemv_max_m = dict(gemv.CLASS_MAX_M), gemv.GEMV_MAX_M
    applied = tuning.apply_gemv_sweep(str(WIDE_SWEEP))
    assert applied["configs"] == defaults
    assert applied["CLASS_MAX_M"] == class_max_m == {"narrow": 64, "medium": 32}
    assert gemv.GEMV_MAX_M == gemv_max_m  # a wide sweep leaves the plain limit alone


def _row(shape: str, m: int, us: float, config: dict | None) -> dict:
    return {"shape": shape, "m": m, "us": us, "ok": True, "gemv_config": config}


def test_a_plain_sweep_sets_the_limit_where_every_shape_still_beats_cublas(tuning, tmp_path):
    gemv = tuning.gemv
    fast = asdict(gemv.GemvConfig(block_n=16, num_warps=1))
    rows = []
    for shape, _, _ in tuning.SHAPES:
        for m, cublas_us, ours in [(1, 10.0, 5.0), (4, 10.0, 9.0), (8, 10.0, 11.0)]:
            rows += [_row(shape, m, cublas_us, None), _row(shape, m, ours, fast)]
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"rows": rows}))
    applied = tuning.apply_gemv_sweep(str(path))
    assert applied["GEMV_MAX_M"] == gemv.GEMV_MAX_M == 4  # slower than cuBLAS at 8 rows
    assert set(applied["configs"]) == {
        "narrow_m1",
        "narrow",
        "medium_m1",
        "medium",
        "tall_m1",
        "tall",
    }
