"""The kernels compiled for the GPU (sm_90) on this CPU machine, in a process of their own.

TRITON_INTERPRET, which runs the other CPU tests, skips the compiler's checks: in session 29 a
`tl.constexpr` assigned inside a `tl.static_range` loop (reassigned once unrolled) passed every
CPU test and broke the route kernel, and with it every v2 MoE layer, on the GPU. Triton compiles
for an sm_90 target without a GPU (`benchmarks/sass_counts.py`), which catches that class.
"""

from __future__ import annotations

import pytest

from gossamer.testing import run_compiling

# Run in a fresh interpreter: this process imported Triton in interpreter mode (conftest.py), whose
# jit functions the compiler cannot take.
COMPILE_SCRIPT = """
import re

import sass_counts as sc
from gossamer.kernels import moe_mxfp4 as moe

ROUTE_ARGS = dict(logits_ptr="*bf16", ids_ptr="*i32", weights_ptr="*fp32", x_ptr="*bf16",
                  x_out_ptr="*bf16", x_unscale_ptr="*fp32", logits_row_stride="i32")
for name, code in moe._X_LAYOUTS.items():
    out = "*fp16" if name == "fp16" else ("*fp32" if name == "planes" else "*bf16")
    sc.compile_sm90(moe._route_kernel, ROUTE_ARGS | dict(x_out_ptr=out),
                    dict(E=128, E_P2=128, TOP_K=4, K_P2=4, H=2880, X_LAYOUT=code, BLOCK_H=1024,
                         V2_GROUPS=8), 4)
    print("route", name)  # one line each, read by the test
eight = moe.V2_TILE_CHANGES[8] | {"LAYOUT": moe.LAYOUT_FP16_LANES}
for changes in ({}, {"SYNC": True}, {"SYNC": True, "REP": 2}, {"SYNC": True, "maxnreg": 64}):
    gate_up, down = (config | eight | changes for config in moe.v2_configs(8))
    for _, kernel in sc.v2_kernels(8, gate_up, down):
        registers = 1 + max(int(r) for r in re.findall(r"\\bR(\\d+)\\b", sc.sass(kernel)))
        assert registers <= changes.get("maxnreg", 255), (changes, registers)
    print("v2-kernels", changes or "v2_order")
"""


def test_route_and_v2_kernels_compile_for_sm90():
    done = run_compiling(COMPILE_SCRIPT)
    if done.returncode != 0:
        pytest.fail(f"compile for sm_90 failed:\n{done.stderr[-3000:]}")
    compiled = done.stdout.split()
    assert (
        compiled.count("route") == 5 and "v2_sync" in compiled and compiled.count("v2-kernels") == 4
    )
