"""Instructions per weight of the expert-grouped packed-fp16 GEMV (gossamer/kernels/
moe_grouped_gemv.py), from SASS compiled for sm_90 without a GPU (benchmarks/sass_counts.py's
compile and loop count).

    PYTHONPATH=/path/to/triton-3.6:. python benchmarks/moe_grouped_gemv_sass.py

For each kernel, config and BLOCK_M: the main loop's instruction count per thread, per weight
(what one loop iteration of one thread streams) and per weight per token (divided by BLOCK_M:
the figure to compare with the decode GEMV's per-weight count at one pair per expert read), and
the shared-memory instructions in the loop (0 means no layout conversion between the weight
tile and the M tokens' x words; the pipelined loops read their words from shared memory). A loop
that UNROLL unrolls completely (2 steps of 32 groups) leaves no loop to count ("1 per loop").
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from moe_grouped_gemv_sweep import DOWN_SHAPES, GATE_UP_SHAPES, configs  # noqa: E402
from sass_counts import INTER, SCHEDULE_ARGS, H, compile_sm90, loop_histogram  # noqa: E402

from gossamer.kernels import moe_grouped_gemv as gemv  # noqa: E402
from gossamer.kernels import moe_mxfp4 as moe  # noqa: E402

GATE_UP_ARGS = dict(x_ptr="*i32", x_unscale_ptr="*fp32", **SCHEDULE_ARGS, words_ptr="*i32",
                    scales_ptr="*u8", bias_ptr="*bf16", act_ptr="*fp16", limit="fp32",
                    alpha="fp32", scale_step="i32")  # fmt: skip
GEMV_DOWN_ARGS = dict(act_ptr="*i32", sorted_pairs_ptr="*i32", route_w_ptr="*fp32",
                      counts_ptr="*i32", offsets_ptr="*i32", tile_ends_ptr="*i32",
                      words_ptr="*i32", scales_ptr="*u8", bias_ptr="*bf16", y_ptr="*fp32",
                      scale_step="i32")  # fmt: skip
SHARED = ("LDS", "STS", "BAR", "LDSM")


def resources(compiled) -> tuple[int, int]:
    """(registers per thread, spill stores) of the cubin, from cuobjdump (no GPU needed)."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
        text = subprocess.run([tool, "-res-usage", path], capture_output=True, text=True).stdout
    regs = re.search(r"REG:(\d+)", text)
    spills = re.search(r"STACK:(\d+)", text)
    return int(regs.group(1)) if regs else -1, int(spills.group(1)) if spills else -1


def count(kernel_name: str, compiled, weights_per_thread: float, block_m: int) -> dict:
    opcodes = loop_histogram(compiled)
    total = sum(opcodes.values())
    shared = sum(n for op, n in opcodes.items() if op.startswith(SHARED))
    top = ", ".join(f"{op} {n}" for op, n in opcodes.most_common(7))
    per_weight = total / weights_per_thread
    regs, stack = resources(compiled)
    print(f"{kernel_name:44s} M={block_m}  {total:5d} per loop  {per_weight:5.2f} per weight"
          f"  {per_weight / block_m:5.2f} per weight-token  shared {shared:3d}  regs {regs:3d}"
          f" stack {stack:3d}  ({top})", flush=True)  # fmt: skip
    return {"kernel": kernel_name, "block_m": block_m, "per_loop": total, "per_weight": per_weight,
            "shared": shared, "regs": regs, "stack": stack}  # fmt: skip


def _name(config: dict) -> str:
    return "/".join(f"{k[0]}{v}" for k, v in config.items())


def _steps(config: dict) -> int:
    """Steps per iteration of the main loop (the register double buffer's loop is unrolled)."""
    return config.get("UNROLL", 1) if config.get("NUM_STAGES", 0) == 0 else 1


def gate_up(config: dict, block_m: int, layout: int, specialize: bool = False) -> dict:
    """The gate_up kernel; without specialize its only body has BLOCK_M token slots."""
    constexprs = {k: v for k, v in config.items() if k != "num_warps"} | {"SPECIALIZE": specialize}
    compiled = compile_sm90(gemv._gemv_gate_up_kernel, GATE_UP_ARGS,
                            dict(H=H, INTER=INTER, E=128, E_P2=128, TOP_K=4, ACT_EXP=10,
                                 BLOCK_M=block_m, LAYOUT=layout, **constexprs),
                            config["num_warps"])  # fmt: skip
    weights = _steps(config) * config["BLOCK_PAIRS"] * 2 * config["GROUPS_PER_STEP"]
    weights /= config["num_warps"]  # x 32 weights per group / 32 threads per warp
    return count(f"gate_up {_name(config)}", compiled, weights, block_m)


def down(config: dict, block_m: int, layout: int, specialize: bool = False) -> dict:
    constexprs = {k: v for k, v in config.items() if k != "num_warps"} | {"SPECIALIZE": specialize}
    compiled = compile_sm90(gemv._gemv_down_kernel, GEMV_DOWN_ARGS,
                            dict(H=H, INTER=INTER, E=128, E_P2=128, ACT_EXP=10, BLOCK_M=block_m,
                                 LAYOUT=layout, **constexprs),
                            config["num_warps"])  # fmt: skip
    weights = _steps(config) * config["BLOCK_ROWS"] * config["GROUPS_PER_STEP"]
    weights /= config["num_warps"]
    return count(f"down {_name(config)}", compiled, weights, block_m)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--block-m", default="1,2,4,8")
    parser.add_argument("--layout", type=int, default=moe.LAYOUT_FP16_LANES)
    parser.add_argument("--all", action="store_true", help="the sweep's shapes, not the defaults")
    parser.add_argument("--unroll", type=int, default=0, help="UNROLL for every config")
    args = parser.parse_args()
    print(f"triton {triton.__version__}, sm_90, gpt-oss-120b shapes, layout {args.layout}")
    sizes = [int(m) for m in args.block_m.split(",")]
    gate_ups, downs = [gemv.GEMV_GATE_UP], [gemv.GEMV_DOWN]
    if args.all:
        gate_ups = configs(GATE_UP_SHAPES, "BLOCK_PAIRS", gemv.GEMV_GATE_UP)
        downs = configs(DOWN_SHAPES, "BLOCK_ROWS", gemv.GEMV_DOWN)
    if args.unroll:
        gate_ups = [c | {"UNROLL": args.unroll} for c in gate_ups]
        downs = [c | {"UNROLL": args.unroll} for c in downs]
    print("# one body of BLOCK_M token slots (SPECIALIZE off): the loop of that size")
    for config in gate_ups:
        for block_m in sizes:
            gate_up(config, block_m, args.layout)
    for config in downs:
        for block_m in sizes:
            down(config, block_m, args.layout)
    print("# SPECIALIZE on (a body per size up to BLOCK_M): registers are the largest body's")
    for block_m in sizes[1:]:
        gate_up(gate_ups[0], block_m, args.layout, specialize=True)
        down(downs[0], block_m, args.layout, specialize=True)


if __name__ == "__main__":
    main()
