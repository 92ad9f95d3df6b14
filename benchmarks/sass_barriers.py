"""Which scoreboard barriers the 8-row v2 loop's loads set and its instructions wait on (sm_90 SASS
compiled offline, control bits decoded).

    PYTHONPATH=. python benchmarks/sass_barriers.py [--padded] [--kernel gate_up|down]

A variable-latency instruction (a global or shared load) sets one of six write barriers, and a
consumer waits on barriers, not registers: a shared-memory load on the barrier of a global load
makes its consumers wait for both. Nsight Compute's warp sampling (session 30, H100) put 13% of
the tile's samples at one register move that waits on long_scoreboard for a shared load; this
lists the loop's loads with their barriers to show which global loads share them. Decoding
(Volta and later): the second 64-bit word of each instruction holds, from bit 41, the stall
count (4 bits), yield (1), write barrier (3; 7 = none), read barrier (3) and wait mask (6).
Use triton 3.6 (the GPU image's) for the SASS the GPU runs (see sass_counts.py).
"""

from __future__ import annotations

import argparse
import re

import triton

import benchmarks.sass_counts as sc
from benchmarks.ncu_source import opcode
from gossamer.kernels import moe_mxfp4 as moe

_LINE = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\* (0x[0-9a-f]+) \*/")
_HIGH = re.compile(r"^\s*/\* (0x[0-9a-f]+) \*/\s*$")


def decode(listing: str) -> list[dict]:
    """nvdisasm -hex output -> [{address, text, write, read, wait}] (write/read None: no barrier)."""
    lines = listing.splitlines()
    out = []
    for line, following in zip(lines, lines[1:], strict=False):
        first, second = _LINE.match(line), _HIGH.match(following)
        if not (first and second):
            continue
        control = int(second.group(1), 16) >> 41
        write, read = (control >> 5) & 7, (control >> 8) & 7
        out.append({"address": int(first.group(1), 16), "text": first.group(2).strip(),
                    "write": None if write == 7 else write, "read": None if read == 7 else read,
                    "wait": [b for b in range(6) if (control >> 11) >> b & 1]})  # fmt: skip
    return out


def loop_instructions(listing: str) -> list[dict]:
    """The decoded instructions of the largest loop (as sass_counts.loop_lines finds it)."""
    loop = sc.loop_lines(listing)
    addresses = [int(m.group(1), 16) for line in loop if (m := _LINE.match(line))]
    first, last = min(addresses), max(addresses)
    return [i for i in decode(listing) if first <= i["address"] <= last]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kernel", default="gate_up", choices=("gate_up", "down"))
    parser.add_argument("--padded", action="store_true", help="V2_PADDED_SCALES (S_ROW 96)")
    args = parser.parse_args()
    changes = moe.V2_TILE_CHANGES[8] | {"LAYOUT": moe.LAYOUT_FP16_LANES, "SYNC": True}
    if args.padded:
        changes |= {"S_ROW": 96}
    gu, dn = moe.GROUPED_V2_GATE_UP | changes, moe.GROUPED_V2_DOWN | changes
    compiled = dict(sc.v2_kernels(8, gu, dn))[args.kernel]
    loop = loop_instructions(sc.sass(compiled, "-hex"))
    print(f"triton {triton.__version__}, sm_90, 8-row v2 {args.kernel}"
          f"{' (padded scales)' if args.padded else ''}: {len(loop)} loop instructions")  # fmt: skip
    by_barrier: dict[int, list[str]] = {}
    for ins in loop:
        if ins["write"] is not None and re.search(r"\bLD", ins["text"]):
            by_barrier.setdefault(ins["write"], []).append(opcode(ins["text"]))
    for barrier, loads in sorted(by_barrier.items()):
        kinds = {k: loads.count(k) for k in dict.fromkeys(loads)}
        shared = any(k.startswith("LDS") for k in kinds)
        mixed = " <- global and shared loads on one barrier" if shared and any(
            k.startswith("LDG") for k in kinds) else ""  # fmt: skip
        print(f"  write barrier {barrier}: {kinds}{mixed}")


if __name__ == "__main__":
    main()
