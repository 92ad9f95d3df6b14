"""The Gluon MoE kernels (gossamer/kernels/moe_gluon.py) compiled for sm_90 without a GPU: their
loop's instructions, what runs while the wgmmas are in flight, registers and register hazards.

    python benchmarks/gluon_moe_sass.py

For each kernel (gate_up, down) and token tile (64, 128) at 120b's shapes: the instructions of
the main loop (one step), how many of them sit between each half-step's first HGMMA and its
wgmma wait (work the tensor cores overlap), the CTA barriers, registers a thread (ptxas's, from
the SASS), whether any instruction writes a register an in-flight HGMMA reads
(`wgmma_hazards.py`), and local-memory traffic (spills).
"""

from __future__ import annotations

import collections
import json
import re

import sass_counts
import triton
import wgmma_hazards
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon

from gossamer.kernels import moe_gluon, moe_mxfp4
from gossamer.model import mxfp4

HIDDEN = INTER = 2880
SCHEDULE = dict(sorted_pairs_ptr="*i32", counts_ptr="*i32", offsets_ptr="*i32",
                tile_ends_ptr="*i32")  # fmt: skip
GATE_UP_ARGS = dict(x_ptr="*bf16", **SCHEDULE, w_ptr="*i32", scales_ptr="*u8", bias_ptr="*bf16",
                    act_ptr="*bf16", limit="fp32", alpha="fp32")  # fmt: skip
DOWN_ARGS = dict(act_ptr="*bf16", sorted_pairs_ptr="*i32", route_w_ptr="*fp32",
                 counts_ptr="*i32", offsets_ptr="*i32", tile_ends_ptr="*i32", w_ptr="*i32",
                 scales_ptr="*u8", bias_ptr="*bf16", y_ptr="*fp32")  # fmt: skip


def compile_kernel(name: str, block_m: int, layout: str = mxfp4.LAYOUT_FP16_LANES,
                   num_warps: int = moe_gluon.WARPS, maxnreg: int | None = None):  # fmt: skip
    width = moe_mxfp4._v2_padded(HIDDEN, moe_gluon.GROUPS_PER_STEP)
    common = dict(E=128, E_P2=128, BLOCK_M=block_m,
                  LAYOUT=moe_mxfp4.layout_code_of(layout), H=HIDDEN, INTER=INTER)  # fmt: skip
    if name == "gate_up":
        fn, signature = moe_gluon.gate_up_kernel, GATE_UP_ARGS
        constexprs = common | dict(TOP_K=4, X_WIDTH=width, ACT_WIDTH=width)
    else:
        fn, signature = moe_gluon.down_kernel, DOWN_ARGS
        constexprs = common | dict(X_WIDTH=width)
    aligned = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(signature.values())
               if t.startswith("*")}  # fmt: skip
    source = gluon._runtime.GluonASTSource(
        fn=fn, signature=signature | dict.fromkeys(constexprs, "constexpr"),
        constexprs=constexprs, attrs=aligned,
    )  # fmt: skip
    target = GPUTarget("cuda", 90, 32)
    options = {"num_warps": num_warps} | ({"maxnreg": maxnreg} if maxnreg else {})
    return triton.compile(source, target=target, options=options)


def in_flight(opcodes: list[str]) -> list[int]:
    """Instructions between each step's first HGMMA and its wgmma wait."""
    counts, start = [], None
    for i, op in enumerate(opcodes):
        if op.startswith("HGMMA") and start is None:
            start = i
        elif op.startswith("WARPGROUP.DEPBAR") and start is not None:
            counts.append(sum(not o.startswith("HGMMA") for o in opcodes[start:i]))
            start = None
    return counts


def report(name: str, block_m: int) -> dict:
    text = sass_counts.sass(compile_kernel(name, block_m))
    body = wgmma_hazards.loop_body(sass_counts.loop_lines(text))
    opcodes = [opcode for opcode, _ in body]
    histogram = collections.Counter(op.split(".")[0] for op in opcodes)
    return {
        "kernel": name,
        "block_m": block_m,
        "loop_instructions": len(opcodes),
        "hgmma": histogram["HGMMA"],
        "in_flight": in_flight(opcodes),
        "barriers": histogram["BAR"],
        "local_memory": sum(op.startswith(("LDL", "STL")) for op in text.split()),
        "registers": 1 + max(int(r) for r in re.findall(r"\bR(\d+)\b", text)),
        "hazards": wgmma_hazards.hazards(body),
    }


def main() -> list[dict]:
    print(f"triton {triton.__version__}, sm_90: the Gluon MoE kernels' loop (one step)")
    rows = [report(name, block_m) for name in ("gate_up", "down") for block_m in (64, 128)]
    for row in rows:
        print(f"{row['kernel']:8s} {row['block_m']:4d} tokens: {row['loop_instructions']} "
              f"instructions, {row['hgmma']} HGMMA, in flight {row['in_flight']}, "
              f"{row['barriers']} barriers, {row['registers']} registers, "
              f"{row['local_memory']} local loads/stores, "
              f"{len(row['hazards'])} register hazards")  # fmt: skip
    return rows


if __name__ == "__main__":
    print(json.dumps(main()))
