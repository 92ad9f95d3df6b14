"""Register hazards of v2's asynchronous wgmmas, found in SASS compiled for sm_90 without a GPU.

    PYTHONPATH=/tmp/tri36:. python benchmarks/wgmma_hazards.py [--block-ms 8,16,32,64,128]

v2 feeds its wgmmas an A operand in registers (the dequantized weights). PTX leaves it undefined
to write those registers before `wgmma.wait_group` says the wgmma finished; in SASS the wait is
`WARPGROUP.DEPBAR.LE gsb0, N` (at most N groups still in flight). Session 22 found v2's 64- and
128-row tiles wrong on an H100 and, reading their SASS, the next step's dequantization writing
registers of wgmmas that were still in flight across the loop's back edge. This script makes
that reading repeatable: for each kernel (gate_up, down) and M-tile it walks the main loop twice
(so the back edge is seen), keeps the HGMMAs that may be in flight with their A registers, and
reports every instruction that writes one of those registers, e.g. with --async-max-m 32 (how
the 16- and 32-row tiles ran before session 23; now every wgmma tile waits and none is reported)

    gate_up BLOCK_M  32: 11 hazards, first: IMAD R71 written while HGMMA #8 (R68..R71) may run

Write detection is approximate (the first register operand of an instruction that has a
destination, widened by .64/.128), which errs towards reporting. Use triton 3.6 (the GPU image's)
as sass_counts.py does. _V2_ASYNC_MMA_MAX_M decides which tiles wait each step; pass
--async-max-m to compile as if it were another value (it is read when the module is imported,
so the script sets GOSSAMER_V2_ASYNC_MMA_MAX_M before importing).
"""

from __future__ import annotations

import argparse
import os
import re
import sys

# Opcodes whose first register operand is not a destination (stores, barriers, control).
NO_DESTINATION = ("ST", "BAR", "BRA", "EXIT", "DEPBAR", "WARPGROUP", "LDGSTS", "LDGDEPBAR",
                  "NOP", "RED", "ATOM", "MEMBAR", "FENCE", "CALL", "RET", "ARRIVES", "SYNCS",
                  "ERRBAR", "CCTL", "BSSY", "BSYNC", "WARPSYNC", "HGMMA")  # fmt: skip
HGMMA_A_REGS = 4  # a thread's A fragment of one m64nNk16 bf16 wgmma: 4 32-bit registers
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Za-z0-9_.]+)\s*(.*?);")


def loop_body(lines: list[str]) -> list[tuple[str, str]]:
    """(opcode, operands) of each instruction of a loop's SASS lines (sass_counts.loop_lines)."""
    return [(m.group(1), m.group(2)) for line in lines if (m := _INSTRUCTION.match(line))]


def written_registers(opcode: str, operands: str) -> set[int]:
    """General registers an instruction writes (approximate: its first register operand)."""
    if opcode.split(".")[0].startswith(NO_DESTINATION):
        return set()
    m = re.match(r"R(\d+)\b", operands.strip())
    if not m:
        return set()
    width = 4 if ".128" in opcode else 2 if (".64" in opcode or ".WIDE" in opcode) else 1
    return set(range(int(m.group(1)), int(m.group(1)) + width))


def hazards(body: list[tuple[str, str]]) -> list[str]:
    """Writes to A registers of HGMMAs that may still be in flight, over two passes of the loop."""
    in_flight: list[tuple[int, set[int]]] = []  # (HGMMA number in the loop, its A registers)
    found = []
    for pass_index in range(2):
        number = 0
        for opcode, operands in body:
            if opcode.startswith("HGMMA"):
                number += 1
                m = re.match(r"R\d+,\s*R(\d+)", operands)
                if m:  # a register A operand (an smem A operand is a descriptor)
                    first = int(m.group(1))
                    in_flight.append((number, set(range(first, first + HGMMA_A_REGS))))
            elif opcode.startswith("WARPGROUP.DEPBAR"):
                m = re.search(r"0x([0-9a-f]+)", operands)
                keep = int(m.group(1), 16) if m else 0
                in_flight = in_flight[len(in_flight) - keep :] if keep else []
            for reg in written_registers(opcode, operands):
                for hgmma, regs in in_flight:
                    if reg in regs and pass_index == 1:
                        found.append(f"{opcode} R{reg} written while HGMMA #{hgmma} "
                                     f"(R{min(regs)}..R{max(regs)}) may run")  # fmt: skip
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--block-ms", default="16,32,64,128")
    parser.add_argument("--async-max-m", type=int, default=None,
                        help="compile as if moe_mxfp4._V2_ASYNC_MMA_MAX_M were this")  # fmt: skip
    args = parser.parse_args()
    if args.async_max_m is not None:
        os.environ["GOSSAMER_V2_ASYNC_MMA_MAX_M"] = str(args.async_max_m)
    sys.path.insert(0, os.path.dirname(__file__))
    import sass_counts as sc

    from gossamer.kernels import moe_mxfp4 as moe

    print(f"# _V2_ASYNC_MMA_MAX_M = {moe._V2_ASYNC_MMA_MAX_M.value}")
    for block_m in (int(b) for b in args.block_ms.split(",")):
        for name, compiled in sc.v2_kernels(block_m, *moe.v2_configs(block_m)):
            found = hazards(loop_body(sc.loop_lines(sc.sass(compiled))))
            first = f", first: {found[0]}" if found else ""
            print(f"{name} BLOCK_M {block_m:3d}: {len(found)} hazards{first}")


if __name__ == "__main__":
    main()
