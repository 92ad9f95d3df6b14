"""Apply the launch configs that this run's sweeps measured best, before timing whole steps.

    from tuning import apply_moe_sweep, apply_gemv_sweep

`apply_moe_sweep(path)` reads benchmarks/moe_decode_sweep.py's JSON and sets the packed-fp16 MoE
GEMV's configs to its best point; `apply_grouped_sweep(path)` does the same for the grouped v2
kernels from benchmarks/moe_grouped_sweep.py; `apply_gemv_sweep(path)` reads gemv_sweep.py's JSON,
picks per shape class (and separately for M = 1) the config with the least total time over that
class's shapes, and sets `gemv.GEMV_MAX_M` to the largest M up to which the Triton GEMV beat cuBLAS
on every shape; from a `--wide` sweep (every M >= gemv.WIDE_FROM) it sets the "_wide" configs and
`gemv.CLASS_MAX_M`, per class the largest M up to which they beat cuBLAS on that class's shapes.
Both return what they set, for the record. The defaults in the source are then updated by hand
from the same JSON, so a later run without these files measures the same code.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from gemv_sweep import SHAPES

from gossamer.kernels import gemv, moe_mxfp4


def apply_moe_sweep(path: str) -> dict:
    rows = json.loads(Path(path).read_text())["rows"]
    best = next(r for r in rows if r["kernel"] == "best")["config"]
    moe_mxfp4.DECODE_FP16_GATE_UP = dict(best["gate_up"])
    # the sweep's tile configs carry no AHEAD or EARLY: keep the default's (down loads ahead)
    keys = ("AHEAD", "EARLY")
    ahead = {k: moe_mxfp4.DECODE_FP16_DOWN[k] for k in keys if k in moe_mxfp4.DECODE_FP16_DOWN}
    moe_mxfp4.DECODE_FP16_DOWN = ahead | dict(best["down"])
    return best


def apply_grouped_sweep(path: str) -> dict:
    """benchmarks/moe_grouped_sweep.py's best configs -> the grouped v2 defaults."""
    best = json.loads(Path(path).read_text())["best"]
    moe_mxfp4.GROUPED_V2_GATE_UP = dict(best["gate_up"])
    moe_mxfp4.GROUPED_V2_DOWN = dict(best["down"])
    return best


def apply_gemv_sweep(path: str) -> dict:
    result = json.loads(Path(path).read_text())
    rows = [r for r in result["rows"] if r["gemv_config"] and r["ok"]]
    chosen = {}
    for key, members in _by_class_and_m(rows).items():
        chosen[key] = _least_total_time(members)
    for key, config in chosen.items():
        gemv.CONFIGS[key] = gemv.GemvConfig(**config)
    if all(row["m"] >= gemv.WIDE_FROM for row in result["rows"]):  # a --wide sweep
        limits = {name: _max_m_beating_cublas(result["rows"], chosen, {name})
                  for name in {_class(shape) for shape, _, _ in SHAPES}}  # fmt: skip
        gemv.CLASS_MAX_M = {name: m for name, m in limits.items() if m}
        return {"configs": chosen, "CLASS_MAX_M": gemv.CLASS_MAX_M}
    gemv.GEMV_MAX_M = _max_m_beating_cublas(result["rows"], chosen)
    return {"configs": chosen, "GEMV_MAX_M": gemv.GEMV_MAX_M}


def _class(shape: str) -> str:
    n, k = next((n, k) for name, n, k in SHAPES if name == shape)
    return gemv.shape_class(n, k)


def _config_key(name: str, m: int) -> str:
    """gemv.CONFIGS's key of class `name` at M rows (as gemv.default_config picks it)."""
    if m == 1:
        return f"{name}_m1"
    return f"{name}_wide" if m >= gemv.WIDE_FROM else name


def _by_class_and_m(rows: list[dict]) -> dict[str, list[dict]]:
    """Rows keyed "<class>_m1" (M = 1), "<class>_wide" (M >= gemv.WIDE_FROM) or "<class>",
    classes as gemv.shape_class."""
    grouped = defaultdict(list)
    for row in rows:
        grouped[_config_key(_class(row["shape"]), row["m"])].append(row)
    return grouped


def _least_total_time(rows: list[dict]) -> dict:
    """The config whose summed time over every (shape, M) it ran on is least; only configs that
    ran on all of them compete."""
    cases = {(r["shape"], r["m"]) for r in rows}
    totals = defaultdict(float)
    seen = defaultdict(set)
    for row in rows:
        key = json.dumps(row["gemv_config"], sort_keys=True)
        totals[key] += row["us"]
        seen[key].add((row["shape"], row["m"]))
    complete = [k for k in totals if seen[k] == cases]
    return json.loads(min(complete, key=totals.__getitem__))


def _max_m_beating_cublas(
    rows: list[dict], chosen: dict[str, dict], classes: set[str] | None = None
) -> int:
    """The largest M such that at it and every smaller swept M the chosen config of every shape
    (of `classes`, default all) ran faster than cuBLAS."""
    rows = [r for r in rows if classes is None or _class(r["shape"]) in classes]
    timed = {}
    for key, members in _by_class_and_m([r for r in rows if r["gemv_config"] and r["ok"]]).items():
        for row in members:
            if row["gemv_config"] == chosen.get(key):
                timed[(row["shape"], row["m"])] = row["us"]
    cublas = {(r["shape"], r["m"]): r["us"] for r in rows if r["gemv_config"] is None}
    max_m = 0
    for m in sorted({m for _, m in cublas}):
        if not all(timed.get(key, float("inf")) < us for key, us in cublas.items() if key[1] == m):
            break
        max_m = m
    return max_m
