"""Can a register-A wgmma run while the next step's weights are unpacked? A Gluon probe, compiled
for sm_90 without a GPU (issue #8, prefill's MoE).

    python benchmarks/gluon_overlap.py

v2's MoE tiles above 8 rows wait for each step's wgmmas before the next step dequantizes (their A
operand is in registers, and Triton's `tl.dot` pipelining let the next step overwrite them:
sessions 22-23), so at prefill the tensor cores idle while the weights unpack (thirty-third
session: the 64-row loop at a third of the H100's bf16 peak). Gluon (triton >= 3.6) exposes the
wgmma's asynchrony: `warpgroup_mma(..., is_async=True)` returns a token, and
`warpgroup_mma_wait(0, deps=[token, w])` keeps `w`'s registers untouched until the wait. This
probe builds one loop both ways, a stand-in unpack of int32 words into bf16 (one shift and mask)
feeding a 64x64x64 wgmma a step, and reports where the unpack lands in the loop's SASS: between
the HGMMAs' issue and their wait (overlapped) or not, and any write to the in-flight A registers
(`wgmma_hazards.py`). It is a feasibility check for a Gluon prefill kernel, not that kernel.
"""

from __future__ import annotations

import sys
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sass_counts  # noqa: E402
import wgmma_hazards  # noqa: E402

UNPACK_OPCODES = ("LOP3", "IMAD.SHL", "SHF")  # the stand-in unpack's instructions in SASS


@gluon.jit
def _unpacked(w_ptr, offsets, a_layout: gl.constexpr):
    """Words -> bf16 in the wgmma's A-operand layout (a shift and a mask stand in for MXFP4)."""
    words = gl.load(w_ptr + offsets)
    bits = ((words << 3) & 0x3F80).to(gl.int16)
    return gl.convert_layout(bits.to(gl.bfloat16, bitcast=True), a_layout)


@gluon.jit
def probe_kernel(w_ptr, x_ptr, out_ptr, STEPS: gl.constexpr, OVERLAP: gl.constexpr):
    """out [64, 64] = sum over steps of unpack(w[step]) [64, 64] @ x[step] [64, 64]."""
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16]
    )
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    blocked: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    x_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16)
    rows = gl.arange(0, 64, layout=gl.SliceLayout(1, blocked))
    cols = gl.arange(0, 64, layout=gl.SliceLayout(0, blocked))
    offsets = rows[:, None] * 64 + cols[None, :]
    x_smem = gl.allocate_shared_memory(gl.bfloat16, [64, 64], x_layout)
    acc = gl.zeros([64, 64], gl.float32, layout=acc_layout)
    w = _unpacked(w_ptr, offsets, a_layout)
    for step in range(1, STEPS):
        x_smem.store(gl.load(x_ptr + (step - 1) * 4096 + offsets))
        hopper.fence_async_shared()
        if OVERLAP:  # issue, unpack the next step while the wgmma runs, then wait
            token = hopper.warpgroup_mma(w, x_smem, acc, is_async=True)
            w_next = _unpacked(w_ptr + step * 4096, offsets, a_layout)
            acc, _ = hopper.warpgroup_mma_wait(0, deps=[token, w])
            w = w_next
        else:  # as tl.dot runs v2's wide tiles: the wgmma finishes before the next unpack
            acc = hopper.warpgroup_mma(w, x_smem, acc)
            w = _unpacked(w_ptr + step * 4096, offsets, a_layout)
    gl.store(out_ptr + offsets, gl.convert_layout(acc, blocked))


def compile_probe(overlap: bool):
    signature = {"w_ptr": "*i32", "x_ptr": "*bf16", "out_ptr": "*fp32"}
    constexprs = {"STEPS": 8, "OVERLAP": overlap}
    source = gluon._runtime.GluonASTSource(
        fn=probe_kernel, signature=signature | dict.fromkeys(constexprs, "constexpr"),
        constexprs=constexprs,
    )  # fmt: skip
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


def unpack_in_flight(opcodes: list[str]) -> int:
    """Unpack instructions between the loop's first HGMMA and its wgmma wait: work the tensor
    cores overlap."""
    first = next(i for i, op in enumerate(opcodes) if op.startswith("HGMMA"))
    wait = next(i for i, op in enumerate(opcodes) if op.startswith("WARPGROUP.DEPBAR"))
    return sum(op.startswith(UNPACK_OPCODES) for op in opcodes[first:wait])


def report(overlap: bool) -> dict:
    body = wgmma_hazards.loop_body(sass_counts.loop_lines(sass_counts.sass(compile_probe(overlap))))
    opcodes = [opcode for opcode, _ in body]
    return {
        "overlap": overlap,
        "loop_instructions": len(opcodes),
        "unpack_in_flight": unpack_in_flight(opcodes),
        "unpack_total": sum(op.startswith(UNPACK_OPCODES) for op in opcodes),
        "hazards": wgmma_hazards.hazards(body),
    }


def main() -> list[dict]:
    print(f"triton {triton.__version__}, sm_90: the probe's loop")
    rows = [report(overlap) for overlap in (False, True)]
    for row in rows:
        print(f"{'async wgmma + deps' if row['overlap'] else 'wait, then unpack':20s} "
              f"{row['loop_instructions']:4d} instructions, {row['unpack_in_flight']:3d} of "
              f"{row['unpack_total']} unpack instructions while the wgmma runs, "
              f"{len(row['hazards'])} register hazards")  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
