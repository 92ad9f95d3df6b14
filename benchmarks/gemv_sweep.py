"""Sweep the launch configs of the small-M GEMV (gossamer/kernels/gemv.py) on gpt-oss-120b's dense
decode projections (QKV, O, router) at M = 1, 4, 8 rows, against cuBLAS.

    python benchmarks/gemv_sweep.py --out $OUT/gemv_sweep.json      (about a minute on an H200)
    python benchmarks/gemv_sweep.py --wide --out $OUT/gemv_wide.json   (M = 16, 32, 64: the
        "_wide" tiles, which serve the classes of gemv.CLASS_MAX_M past GEMV_MAX_M rows)

Each point is `copies` calls on different weights captured back to back in one CUDA graph, as in
kernels_small.py (weights come from HBM, launch gaps as in the decode graph). It prints us per call,
GB/s, the share of the device-to-device copy bandwidth measured in the same run, and the speedup
over torch.nn.functional.linear; a config whose output disagrees with cuBLAS is marked BAD and never
reported best. The last lines give the best config per shape class and M, to copy into
gemv.CONFIGS, and the GEMV_MAX_M they support.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import time
from dataclasses import asdict

import torch
import torch.nn.functional as F
import triton
from kernels_small import copies_for, gemv_bytes, make_weights
from timing import copy_bandwidth, graph_seconds_per_call

from gossamer.kernels import gemv
from gossamer.kernels.gemv import GemvConfig

SHAPES = [("qkv", 5120, 2880), ("o_proj", 2880, 4096), ("router_120b", 128, 2880)]  # all biased
TOKENS = (1, 4, 8)
WIDE_TOKENS = (16, 32, 64)

# None = the current default for the shape (gemv.CONFIGS); fma configs run at M == 1 only.
SWEEP: dict[str, list[GemvConfig | None]] = {
    "medium": [
        None,
        GemvConfig(block_n=32, block_k=64, num_warps=2, fixup="reduce"),
        GemvConfig(block_n=32, block_k=64, num_warps=2, split_k=1),
        GemvConfig(block_n=32, block_k=64, num_warps=2, num_stages=6, programs_per_sm=4),
        GemvConfig(block_n=16, block_k=64, num_warps=1, programs_per_sm=8),
        GemvConfig(block_n=64, block_k=64, num_warps=4),
        GemvConfig(block_n=64, block_k=128, num_warps=4, num_stages=3, programs_per_sm=4),
        GemvConfig(kernel="fma", block_n=16, block_k=256, num_warps=4),
        GemvConfig(kernel="fma", block_n=8, block_k=512, num_warps=4, programs_per_sm=8),
        # longer runs of each row per step (access_pattern.py: 16 rows x 128 B steps read at 71%
        # of the copy bandwidth, 4-8 rows x 256-512 B at 84-89%)
        GemvConfig(block_n=16, block_k=128, num_warps=1, programs_per_sm=8),
        GemvConfig(block_n=16, block_k=128, num_warps=2, programs_per_sm=6),
        GemvConfig(block_n=16, block_k=256, num_warps=2, programs_per_sm=4, num_stages=3),
        GemvConfig(block_n=16, block_k=256, num_warps=4, programs_per_sm=4, num_stages=3),
        GemvConfig(kernel="fma", block_n=4, block_k=512, num_warps=2, programs_per_sm=8),
        GemvConfig(kernel="fma", block_n=8, block_k=256, num_warps=2, programs_per_sm=8),
    ],
    "narrow": [
        None,
        GemvConfig(block_n=16, block_k=64, num_warps=1, programs_per_sm=1, fixup="reduce"),
        GemvConfig(block_n=16, block_k=32, num_warps=1, programs_per_sm=2),
        GemvConfig(block_n=32, block_k=64, num_warps=2, programs_per_sm=1),
        GemvConfig(kernel="fma", block_n=8, block_k=256, num_warps=2, programs_per_sm=1),
    ],
}


# --wide: tiles for 16..64 rows. Every program reads the whole x tile of its K range, so W blocks
# of 64-128 rows keep x's L2 reads near W's bytes; the batch-16 tile (16 x 64, one warp) shows
# what narrow blocks cost there.
WIDE_SWEEP: dict[str, list[GemvConfig | None]] = {
    "medium": [
        None,
        GemvConfig(block_n=64, block_k=64, num_warps=4, num_stages=6, programs_per_sm=2),
        GemvConfig(block_n=64, block_k=128, num_warps=4, num_stages=3, programs_per_sm=2),
        GemvConfig(block_n=64, block_k=64, num_warps=4, programs_per_sm=4),
        GemvConfig(block_n=64, block_k=64, num_warps=4, split_k=1),
        GemvConfig(block_n=128, block_k=64, num_warps=4, programs_per_sm=1),
        GemvConfig(block_n=128, block_k=64, num_warps=8, programs_per_sm=1),
        GemvConfig(block_n=32, block_k=64, num_warps=2, programs_per_sm=4),
        GemvConfig(block_n=16, block_k=64, num_warps=1, programs_per_sm=8),
    ],
    "narrow": [
        None,
        GemvConfig(block_n=16, block_k=64, num_warps=1, programs_per_sm=1),
        GemvConfig(block_n=32, block_k=64, num_warps=2, programs_per_sm=2),
        GemvConfig(block_n=32, block_k=128, num_warps=2, num_stages=3, programs_per_sm=1),
        GemvConfig(block_n=64, block_k=64, num_warps=4, programs_per_sm=1),
        GemvConfig(block_n=128, block_k=64, num_warps=4, programs_per_sm=1),
        GemvConfig(block_n=32, block_k=64, num_warps=2, programs_per_sm=1, fixup="reduce"),
    ],
}
WIDE_SWEEP["tall"] = WIDE_SWEEP["medium"]


def label(config: GemvConfig) -> str:
    split = "auto" if config.split_k is None else str(config.split_k)
    stages = f" s{config.num_stages}" if config.kernel == "dot" else ""
    return (f"{config.kernel} {config.block_n}x{config.block_k} w{config.num_warps}{stages} "
            f"p{config.programs_per_sm} split={split} {config.fixup}")  # fmt: skip


def output_ok(x, weight, bias, config) -> bool:
    out = gemv.gemv(x, weight, bias, config).float()
    exact = F.linear(x.float(), weight.float(), bias.float())
    return bool(torch.allclose(out, exact, atol=3e-2, rtol=2e-2))


def sweep_shape(
    name: str, n: int, k: int, bandwidth: float, sms: int, tokens=TOKENS, sweep=None
) -> list[dict]:
    copies = copies_for(n * k * 2, max_copies=512)
    weights = list(zip(*make_weights(n, k, True, copies), strict=True))
    sweep = SWEEP if sweep is None else sweep
    rows = []
    for m in tokens:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        nbytes = gemv_bytes(m, n, k, True)
        cublas_us = 1e6 * graph_seconds_per_call([functools.partial(F.linear, x, w, b)
                                                  for w, b in weights])  # fmt: skip
        print(f"{name:12s} M={m} {'cuBLAS':56s} {_numbers(cublas_us, nbytes, bandwidth)}")
        rows.append(_row(name, m, "cuBLAS", None, cublas_us, nbytes, bandwidth, cublas_us, True))
        for config in sweep[gemv.shape_class(n, k)]:
            plan = gemv.plan_gemv(m, n, k, sms, config)
            if config is not None and plan.config.kernel != config.kernel:
                continue  # an fma config at M > 1 would only repeat a dot one
            text = f"{'default ' if config is None else ''}{label(plan.config)}"
            text += f" [{plan.row_blocks}x{plan.split_k}]"
            try:
                ok = output_ok(x, *weights[0], config)
                us = 1e6 * graph_seconds_per_call([functools.partial(gemv.gemv, x, w, b, config)
                                                   for w, b in weights])  # fmt: skip
            except Exception as error:  # noqa: BLE001 - a config that fails is a result
                print(f"{name:12s} M={m} {text:56s} failed: {type(error).__name__}: {error}")
                torch.cuda.synchronize()
                continue
            flag = "" if ok else "  BAD OUTPUT"
            print(f"{name:12s} M={m} {text:56s} {_numbers(us, nbytes, bandwidth)} "
                  f"{cublas_us / us:5.2f}x{flag}")  # fmt: skip
            rows.append(_row(name, m, text, plan, us, nbytes, bandwidth, cublas_us, ok))
    return rows


def _numbers(us: float, nbytes: float, bandwidth: float) -> str:
    gbps = nbytes / us / 1e3
    return f"{us:7.2f} us {gbps:7.0f} GB/s {100 * gbps * 1e9 / bandwidth:4.0f}%"


def _row(name, m, text, plan, us, nbytes, bandwidth, cublas_us, ok) -> dict:
    return dict(
        shape=name, m=m, config=text, us=us, gbps=nbytes / us / 1e3,
        pct_copy=100 * nbytes / us / 1e-6 / bandwidth, floor_us=1e6 * nbytes / bandwidth,
        cublas_us=cublas_us, ok=ok,
        gemv_config=None if plan is None else asdict(plan.config),
        split_k=None if plan is None else plan.split_k,
    )  # fmt: skip


def best_rows(rows: list[dict]) -> dict[str, dict]:
    best: dict[str, dict] = {}
    for row in rows:
        key = f"{row['shape']} M={row['m']}"
        if row["gemv_config"] and row["ok"] and (key not in best or row["us"] < best[key]["us"]):
            best[key] = row
    return best


def supported_max_m(best: dict[str, dict], tokens=TOKENS) -> int:
    """The largest swept M such that at it and every smaller swept M each shape's best beats
    cuBLAS."""
    max_m = 0
    for m in tokens:
        at_m = [row for row in best.values() if row["m"] == m]
        if len(at_m) < len(SHAPES) or any(row["us"] > row["cublas_us"] for row in at_m):
            break
        max_m = m
    return max_m


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=None, help="JSON file to write")
    parser.add_argument("--wide", action="store_true",
                        help=f"M = {WIDE_TOKENS} with the wide tiles (WIDE_SWEEP)")  # fmt: skip
    args = parser.parse_args()
    tokens, sweep = (WIDE_TOKENS, WIDE_SWEEP) if args.wide else (TOKENS, SWEEP)
    torch.manual_seed(0)
    begin = time.time()
    bandwidth = copy_bandwidth()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    device = torch.cuda.get_device_name()
    print(f"# {device} ({sms} SMs), torch {torch.__version__}, triton {triton.__version__}, "
          f"copy bandwidth {bandwidth / 1e12:.2f} TB/s, {time.strftime('%Y-%m-%d')}")  # fmt: skip
    rows = []
    for name, n, k in SHAPES:
        rows += sweep_shape(name, n, k, bandwidth, sms, tokens, sweep)
        torch.cuda.empty_cache()
    best = best_rows(rows)
    print("# best per shape and M (floor = bytes / copy bandwidth)")
    for key, row in best.items():
        print(f"{key:18s} {row['us']:7.2f} us (cuBLAS {row['cublas_us']:6.2f}, floor "
              f"{row['floor_us']:5.2f}) {row['config']}")  # fmt: skip
    max_m = supported_max_m(best, tokens)
    print(f"# best beats cuBLAS on every shape up to M = {max_m}; {time.time() - begin:.0f} s")
    if args.out:
        result = dict(device=device, sms=sms, torch=torch.__version__, triton=triton.__version__,
                      python=platform.python_version(), date=time.strftime("%Y-%m-%d"),
                      copy_bandwidth=bandwidth, rows=rows, best=best)  # fmt: skip
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
        print(f"# wrote {args.out}")


if __name__ == "__main__":
    main()
