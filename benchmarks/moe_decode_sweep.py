"""Sweep the launch configs of the batch-1 MXFP4 MoE decode kernels on real gpt-oss-120b shapes.

The packed-fp16 GEMV's configs are swept (gate_up first, then down with the best gate_up),
beside the fp32 GEMV at its defaults.

    python benchmarks/moe_decode_sweep.py [--json out.json]
    python benchmarks/moe_decode_sweep.py --ahead 5   # only down's AHEAD 0/2 A/B at the defaults

Every point is the whole MoE op at T=1 (route + gate_up + down), 32 calls with different experts
captured in one CUDA graph so neither launch overhead nor L2 hits flatter it. The byte floor is
the four experts' packed weights, scales and biases over a measured device-to-device copy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels_moe import (  # noqa: E402
    ALPHA,
    DOWN_BYTES,
    GATE_UP_BYTES,
    LIMIT,
    TOP_K,
    experts_for,
    make_calls,
    make_experts,
)
from timing import copy_bandwidth, graph_seconds_per_call  # noqa: E402

from gossamer.kernels import moe_mxfp4 as moe  # noqa: E402

# The packed-fp16 GEMV (moe_mxfp4_decode_fp16): BLOCK, GROUPS_PER_STEP, SPLIT_K, num_warps.
# The packed-fp16 GEMV (moe_mxfp4_decode_fp16): BLOCK, GROUPS_PER_STEP, SPLIT_K, num_warps,
# NUM_STAGES (0: register double buffer; >= 2: tl.range pipelining through shared memory).
GATE_UP = [
    {"BLOCK_PAIRS": bp, "GROUPS_PER_STEP": gs, "SPLIT_K": sk, "num_warps": w, "NUM_STAGES": ns}
    for bp, gs, sk, w, ns in [
        (16, 8, 1, 2, 0), (16, 8, 1, 2, 3), (16, 8, 1, 2, 4), (32, 8, 1, 4, 3), (16, 16, 1, 2, 3),
        (8, 16, 1, 1, 3), (16, 16, 1, 4, 4), (32, 8, 1, 4, 0), (16, 16, 1, 4, 0), (8, 8, 1, 1, 0),
        # fewer rows, longer runs of each row per step: benchmarks/access_pattern.py reads the
        # gate_up bytes at 53% of the copy bandwidth as 32 rows x 128 B steps (16 pairs x 8 groups)
        # and at 84-89% as 4-8 rows x 256-512 B
        (4, 16, 1, 2, 0), (4, 32, 1, 4, 0), (4, 32, 1, 2, 0), (8, 32, 1, 4, 0), (2, 32, 1, 2, 0),
        (8, 16, 1, 2, 0), (2, 64, 1, 4, 0), (4, 64, 1, 4, 0), (2, 16, 1, 1, 0), (4, 16, 1, 1, 0),
    ]
]  # fmt: skip
DOWN = [
    {"BLOCK_ROWS": br, "GROUPS_PER_STEP": gs, "SPLIT_K": sk, "num_warps": w, "NUM_STAGES": ns}
    for br, gs, sk, w, ns in [
        (4, 16, 1, 4, 0), (4, 16, 1, 4, 3), (8, 8, 1, 4, 3), (8, 16, 1, 4, 3), (4, 8, 1, 2, 3),
        (4, 16, 1, 4, 4), (2, 16, 1, 2, 3), (8, 8, 2, 4, 0), (8, 8, 1, 4, 0), (4, 8, 1, 2, 0),
        # longer runs per (row, expert), as for gate_up
        (2, 16, 1, 4, 0), (2, 16, 1, 2, 0), (1, 32, 1, 2, 0), (2, 32, 1, 4, 0), (1, 64, 1, 4, 0),
        (1, 32, 1, 4, 0), (1, 16, 1, 1, 0), (2, 32, 1, 2, 0),
    ]
]  # fmt: skip


def time_fp32(experts, inputs) -> float:
    """The fp32 GEMV (moe_mxfp4_decode) at its defaults: the baseline."""
    experts = experts_for("decode", experts)
    calls = [
        lambda x=x, lg=lg: moe.moe_mxfp4_decode(x, lg, experts, TOP_K, LIMIT, ALPHA)
        for x, lg in inputs
    ]
    return graph_seconds_per_call(calls)


def time_config(experts, inputs, gate_up: dict, down: dict) -> float:
    def call(x, logits):
        return moe.moe_mxfp4_decode_fp16(
            x, logits, experts, TOP_K, LIMIT, ALPHA, gate_up_config=gate_up, down_config=down
        )

    return graph_seconds_per_call([lambda x=x, lg=lg: call(x, lg) for x, lg in inputs])


def sweep(experts, inputs, kind: str, configs: list[dict], gate_up: dict, down: dict) -> list:
    rows = []
    for cfg in configs:
        gu = cfg if kind == "gate_up" else gate_up
        dn = cfg if kind == "down" else down
        try:
            us = time_config(experts, inputs, gu, dn) * 1e6
        except Exception as error:  # noqa: BLE001 - a config that fails to compile is a result
            print(f"{kind:8s} {cfg} failed: {type(error).__name__}: {str(error)[:200]}")
            torch.cuda.synchronize()
            continue
        rows.append({"kernel": kind, "config": cfg, "us": us})
        print(f"{kind:8s} {str(list(cfg.values())):18s} {us:8.1f} us")
    return rows


def ahead_ab(experts, inputs, rounds: int) -> list[dict]:
    """The default configs with down's AHEAD 0 and 2 (its scales and activation words loaded a
    step early; gate_up has no such option, see moe_mxfp4.DECODE_FP16_DOWN), each timed in turn
    `rounds` times: median us per layer."""
    times: dict[int, list[float]] = {0: [], 2: []}
    for _ in range(rounds):
        for ahead, runs in times.items():
            down = moe.DECODE_FP16_DOWN | {"AHEAD": ahead}
            down["EARLY"] = down.get("EARLY", 0) if ahead == 2 else 0  # EARLY needs AHEAD 2
            runs.append(time_config(experts, inputs, moe.DECODE_FP16_GATE_UP, down) * 1e6)
    rows = []
    for ahead, us in times.items():
        rows.append({"kernel": "ahead", "config": {"down": ahead},
                     "us": statistics.median(us), "runs_us": us})  # fmt: skip
        print(f"down AHEAD {ahead}: {statistics.median(us):6.1f} us "
              f"(runs {', '.join(f'{t:.1f}' for t in us)})")  # fmt: skip
    return rows


# Down configs around the default, each with AHEAD 2 (rows, groups per step, warps).
DOWN_AHEAD = [(1, 16, 1), (1, 32, 1), (2, 16, 1), (2, 16, 2), (1, 16, 2), (4, 16, 4)]


def down_ahead_sweep(experts, inputs, rounds: int) -> list[dict]:
    """DOWN_AHEAD beside the default gate_up, in turn `rounds` times: median us per layer."""
    configs = [
        {"BLOCK_ROWS": r, "GROUPS_PER_STEP": g, "SPLIT_K": 1, "num_warps": w, "AHEAD": 2}
        for r, g, w in DOWN_AHEAD
    ]
    times: list[list[float]] = [[] for _ in configs]
    for _ in range(rounds):
        for runs, down in zip(times, configs, strict=True):
            runs.append(time_config(experts, inputs, moe.DECODE_FP16_GATE_UP, down) * 1e6)
    rows = []
    for down, us in zip(configs, times, strict=True):
        rows.append({"kernel": "down_ahead", "config": down, "us": statistics.median(us)})
        print(f"down {[down[k] for k in ('BLOCK_ROWS', 'GROUPS_PER_STEP', 'num_warps')]} "
              f"AHEAD 2: {statistics.median(us):6.1f} us")  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", default=None)
    parser.add_argument("--ahead", type=int, default=0, help="rounds of down's AHEAD A/B only")
    parser.add_argument("--down-ahead", action="store_true", help="with --ahead: DOWN_AHEAD too")
    args = parser.parse_args()
    bandwidth = copy_bandwidth()
    experts = make_experts()
    inputs = make_calls(1, 32, seed=1)
    floor_us = TOP_K * (GATE_UP_BYTES + DOWN_BYTES) / bandwidth * 1e6
    print(f"# copy {bandwidth / 1e12:.2f} TB/s; floor {floor_us:.1f} us per MoE layer at T=1")
    if args.ahead:
        rows = ahead_ab(experts, inputs, args.ahead)
        if args.down_ahead:
            rows += down_ahead_sweep(experts, inputs, args.ahead)
        if args.json:
            Path(args.json).write_text(json.dumps({"floor_us": floor_us, "rows": rows}))
        return
    baseline = time_fp32(experts, inputs) * 1e6
    print(f"fp32 GEMV at its defaults: {baseline:.1f} us ({floor_us / baseline:.0%} of floor)")
    rows = [{"kernel": "fp32_baseline", "config": {}, "us": baseline}]
    gu_rows = sweep(experts, inputs, "gate_up", GATE_UP, GATE_UP[0], moe.DECODE_FP16_DOWN)
    best_gu = min(gu_rows, key=lambda r: r["us"])["config"] if gu_rows else GATE_UP[0]
    dn_rows = sweep(experts, inputs, "down", DOWN, best_gu, DOWN[0])
    best_dn = min(dn_rows, key=lambda r: r["us"])["config"] if dn_rows else DOWN[0]
    rows += gu_rows + dn_rows
    best = time_config(experts, inputs, best_gu, best_dn) * 1e6
    print(
        f"best: gate_up {best_gu}, down {best_dn}: {best:.1f} us ({floor_us / best:.0%} of floor)"
    )
    rows.append({"kernel": "best", "config": {"gate_up": best_gu, "down": best_dn}, "us": best})
    for row in rows:
        row["floor_us"] = floor_us
    if args.json:
        Path(args.json).write_text(json.dumps({"triton": triton.__version__, "rows": rows}))


if __name__ == "__main__":
    main()
