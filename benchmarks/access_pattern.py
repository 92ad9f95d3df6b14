"""Does the MoE GEMVs' access pattern cap HBM bandwidth? (issue #8)

The decode GEMVs read a [rows, 1440-byte] MXFP4 matrix as tiles of BLOCK_ROWS rows x STEP_BYTES
bytes: each program walks its rows' K range one step at a time, so one step touches BLOCK_ROWS
separate runs of STEP_BYTES bytes, 1440 bytes apart. This reads the same bytes with the same
program and step structure, with almost no arithmetic (an xor per word), in two layouts:

* row-major: the checkpoint's layout, as the kernels read it today;
* tiled: the matrix repacked so that each (program, step) tile is one contiguous block.

If "tiled" is much faster than "row-major" at the kernels' tile shapes, repacking the weights at
load time (tile-major, as Marlin-style kernels do) is worth its complexity; if both are near the
copy bandwidth, the kernels' time goes elsewhere (instructions, latency).

    python benchmarks/access_pattern.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl
from timing import copy_bandwidth, graph_seconds_per_call

ROW_WORDS = 360  # 2880 codes = 1440 bytes = 360 int32 words per row (gpt-oss-120b)


@triton.jit
def _read_kernel(
    w_ptr,
    out_ptr,
    rows,
    ROW_WORDS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    STEP_WORDS: tl.constexpr,
    TILED: tl.constexpr,
):
    pid = tl.program_id(0)
    r = tl.arange(0, BLOCK_ROWS)[:, None]
    w = tl.arange(0, STEP_WORDS)[None, :]
    acc = tl.zeros([BLOCK_ROWS, STEP_WORDS], tl.int32)
    steps: tl.constexpr = (ROW_WORDS + STEP_WORDS - 1) // STEP_WORDS
    for step in range(steps):
        col = step * STEP_WORDS + w
        ok = col < ROW_WORDS
        if TILED:  # tile (pid, step) is one contiguous [BLOCK_ROWS, STEP_WORDS] block
            offs = ((pid * steps + step) * BLOCK_ROWS + r) * STEP_WORDS + w
        else:
            offs = (pid * BLOCK_ROWS + r) * ROW_WORDS + col
        acc ^= tl.load(w_ptr + offs, mask=ok, other=0)
    tl.store(out_ptr + pid, tl.xor_sum(tl.xor_sum(acc, axis=1), axis=0))


def time_pattern(rows: int, block_rows: int, step_words: int, tiled: bool, warps: int) -> float:
    steps = triton.cdiv(ROW_WORDS, step_words)
    size = rows * (steps * step_words if tiled else ROW_WORDS)
    # 8 copies of the matrix, cycled, so that no read is an L2 hit from the previous call
    copies = [
        torch.randint(0, 1 << 30, (size,), dtype=torch.int32, device="cuda") for _ in range(8)
    ]
    out = torch.empty(rows // block_rows, dtype=torch.int32, device="cuda")
    grid = (rows // block_rows,)

    def call(i: int):
        return lambda: _read_kernel[grid](
            copies[i % 8], out, rows, ROW_WORDS=ROW_WORDS, BLOCK_ROWS=block_rows,
            STEP_WORDS=step_words, TILED=tiled, num_warps=warps,
        )  # fmt: skip

    return graph_seconds_per_call([call(i) for i in range(32)]) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    args = parser.parse_args()
    bandwidth = copy_bandwidth()
    rows = 4 * 5760  # gate_up of four experts: 33 MB of codes
    print(f"copy {bandwidth / 1e12:.2f} TB/s; {rows} rows x 1440 bytes")
    results = []
    for block_rows, step_words, warps in ((32, 32, 2), (4, 64, 4), (16, 32, 2), (8, 128, 4),
                                          (2, 128, 2), (1, 512, 4)):  # fmt: skip
        for tiled in (False, True):
            us = time_pattern(rows, block_rows, step_words, tiled, warps)
            tb_s = rows * ROW_WORDS * 4 / us / 1e6
            name = "tiled" if tiled else "row-major"
            print(f"rows {block_rows:3d} step {step_words * 4:5d} B warps {warps}  {name:9s} "
                  f"{us:7.1f} us  {tb_s:5.2f} TB/s  {tb_s * 1e12 / bandwidth:4.0%} of copy")  # fmt: skip
            results.append(dict(block_rows=block_rows, step_bytes=step_words * 4, warps=warps,
                                tiled=tiled, us=us, tb_s=tb_s))  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copy_bandwidth": bandwidth, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
