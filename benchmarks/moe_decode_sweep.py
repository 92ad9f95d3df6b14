"""Sweep the launch configs of the batch-1 MXFP4 MoE decode kernels on real gpt-oss-120b shapes.

    python benchmarks/moe_decode_sweep.py [--json out.json]

Every point is the whole MoE op at T=1 (route + gate_up + down), 32 calls with different experts
captured in one CUDA graph so neither launch overhead nor L2 hits flatter it. One kernel's config
varies while the other keeps its default. The byte floor is the four experts' packed weights,
scales and biases over a measured device-to-device copy.
"""

from __future__ import annotations

import argparse
import json
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
    make_calls,
    make_experts,
)
from timing import copy_bandwidth, graph_seconds_per_call  # noqa: E402

from gossamer.kernels import moe_mxfp4 as moe  # noqa: E402

GATE_UP = [
    {"BLOCK_PAIRS": bp, "GROUPS_PER_STEP": gs, "num_warps": w}
    for bp, gs, w in [
        (32, 16, 4), (32, 8, 4), (16, 16, 4), (16, 8, 2), (8, 16, 2), (8, 8, 1),
        (16, 32, 4), (8, 32, 4), (64, 8, 8), (32, 32, 8), (16, 16, 8), (4, 32, 2),
    ]
]  # fmt: skip
DOWN = [
    {"BLOCK_ROWS": br, "GROUPS_PER_STEP": gs, "num_warps": w}
    for br, gs, w in [
        (4, 16, 2), (8, 16, 2), (4, 8, 1), (2, 16, 1), (8, 8, 2), (16, 8, 4),
        (4, 32, 4), (8, 32, 4), (16, 16, 4), (2, 32, 2),
    ]
]  # fmt: skip


def time_config(experts, inputs, gate_up: dict, down: dict) -> float:
    def call(x, logits):
        return moe.moe_mxfp4_decode(
            x, logits, experts, TOP_K, LIMIT, ALPHA, gate_up_config=gate_up, down_config=down
        )

    return graph_seconds_per_call([lambda x=x, lg=lg: call(x, lg) for x, lg in inputs])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    bandwidth = copy_bandwidth()
    experts = make_experts()
    inputs = make_calls(1, 32, seed=1)
    floor_us = TOP_K * (GATE_UP_BYTES + DOWN_BYTES) / bandwidth * 1e6
    print(f"# copy {bandwidth / 1e12:.2f} TB/s; floor {floor_us:.1f} us per MoE layer at T=1")
    rows = []
    for kind, configs in (("gate_up", GATE_UP), ("down", DOWN)):
        for cfg in configs:
            gu = cfg if kind == "gate_up" else moe.DECODE_GATE_UP
            dn = cfg if kind == "down" else moe.DECODE_DOWN
            try:
                us = time_config(experts, inputs, gu, dn) * 1e6
            except Exception as error:  # noqa: BLE001 - a config that fails to compile is a result
                print(f"{kind:8s} {cfg} failed: {type(error).__name__}")
                torch.cuda.synchronize()
                continue
            rows.append({"kernel": kind, "config": cfg, "us": us, "floor_us": floor_us})
            print(f"{kind:8s} {str(list(cfg.values())):16s} {us:8.1f} us  {floor_us / us:5.0%}")
    moe.USE_INLINE_PTX = False
    us = time_config(experts, inputs, moe.DECODE_GATE_UP, moe.DECODE_DOWN) * 1e6
    print(f"defaults without inline PTX: {us:.1f} us")
    rows.append({"kernel": "no_ptx", "config": {}, "us": us, "floor_us": floor_us})
    for kind in ("gate_up", "down"):
        best = min((r for r in rows if r["kernel"] == kind), key=lambda r: r["us"], default=None)
        if best:
            print(f"best {kind}: {best['config']} {best['us']:.1f} us")
    if args.json:
        Path(args.json).write_text(json.dumps({"triton": triton.__version__, "rows": rows}))


if __name__ == "__main__":
    main()
