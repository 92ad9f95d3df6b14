"""Which bit layout of the MXFP4 words unpacks cheapest, for fp16 lanes and bf16 lanes at once.

    python benchmarks/unpack_layouts.py            # the Pareto front
    python benchmarks/unpack_layouts.py --triton   # the kernels' recipes for mxfp4.LANE_LAYOUTS

The loader repacks each 32-bit word of 8 e2m1 codes (mxfp4.LAYOUT_FP16_LANES) once, and two
kinds of kernel read it: the batch-1 GEMVs turn register j (codes j and j + 4) into two fp16
lanes (magnitude in bits 9..11 of a lane, sign in 15), the grouped v2 kernel into two bf16 lanes
(magnitude 6..8, sign 15). A layout cheap for one shape is dear for the other, since the sign
sits 6 bits above the magnitude in one and 9 in the other. This script counts, for every layout
in a family, the instructions per word of each unpack and prints the Pareto front.

The family: each code's magnitude bits and sign sit at four distinct positions of a 16-bit half
(a residue r mod 16 each), the high lane's code at the same residues in the other half (the low
lane's bit of a residue may sit in either half: a rotation of the word then swaps the halves).
A register's cost per recipe (instructions; the kernels use these):
  1  the bits already in place: one AND;
  2  one shift or rotation moves all 8 bits: SHF + AND;
  3  an AND, one multiply by a sum of powers of two (copies shifted left, or right through the
     high half of the product) and an AND, checked over all 256 bit patterns for carries into
     kept bits; or two shifts of which one is zero: SHF + 2 LOP3;
  4+ two nonzero shifts or more (2 per distinct shift).
Sharing a shift between two registers (the current bf16 recipe shares one) is not counted, so
the figures are upper bounds of the best recipes: the current layout counts 9 (fp16) and 13
(bf16), where moe_mxfp4 takes 9 and 12.
"""

from __future__ import annotations

import functools
import itertools
import sys

FP16_TARGET = (9, 10, 11, 15)  # bits (m0, e0, e1, sign) of the low lane; the high lane +16
BF16_TARGET = (6, 7, 8, 15)
CURRENT = ((9, 15), (6, 12), (3, 14), (0, 13))  # mxfp4.FP16_LANE_BITS: (magnitude, sign) per j
WORD = 0xFFFFFFFF


def _targets(low: tuple[int, ...]) -> tuple[int, ...]:
    return low + tuple(bit + 16 for bit in low)


@functools.cache
def _carry_free(stored: tuple[int, ...], targets: tuple[int, ...], multiplier: int,
                high: bool) -> bool:  # fmt: skip
    """(word & mask) * multiplier (its low or high 32 bits) & kept == the bits moved, always."""
    mask = sum(1 << p for p in stored)
    kept = sum(1 << q for q in targets)
    for value in range(256):
        word = sum(((value >> i) & 1) << p for i, p in enumerate(stored))
        want = sum(((value >> i) & 1) << q for i, q in enumerate(targets))
        product = (word & mask) * multiplier
        got = (product >> 32) & WORD if high else product & WORD
        if got & kept != want:
            return False
    return True


def register_cost(stored: tuple[int, ...], target: tuple[int, int, int, int]) -> int:
    """Instructions to move one register's 8 bits (low lane m0, e0, e1, sign, then the high
    lane's) from `stored` to the lane target."""
    targets = _targets(target)
    if stored == targets:
        return 1
    rotations = {(q - p) % 32 for p, q in zip(stored, targets, strict=True)}
    if len(rotations) == 1:
        return 2
    shifts = [q - p for p, q in zip(stored, targets, strict=True)]
    if all(s >= 0 for s in shifts):
        multiplier = sum(1 << s for s in set(shifts))
        if multiplier < 2**32 and _carry_free(stored, targets, multiplier, False):
            return 3
    if all(s <= 0 for s in shifts) and all(s > -32 for s in shifts):
        multiplier = sum(1 << (32 + s) for s in set(shifts))
        if _carry_free(stored, targets, multiplier, True):
            return 3
    if len(rotations) == 2 and 0 in rotations:
        return 3
    return 2 * len(rotations) - (1 if 0 in rotations else 0)


def _register_front() -> dict[frozenset, list[tuple[int, int, tuple[int, ...]]]]:
    """For each set of 4 residues: the Pareto-best (fp16, bf16) costs of one register there."""
    fronts: dict[frozenset, dict[tuple[int, int], tuple[int, ...]]] = {}
    for residues in itertools.permutations(range(16), 4):
        for halves in range(16):
            low = tuple(r + 16 * ((halves >> i) & 1) for i, r in enumerate(residues))
            stored = low + tuple((p + 16) % 32 for p in low)
            costs = (register_cost(stored, FP16_TARGET), register_cost(stored, BF16_TARGET))
            fronts.setdefault(frozenset(residues), {}).setdefault(costs, stored)
    return {key: _pareto(points) for key, points in fronts.items()}


def _pareto(points: dict[tuple[int, int], object]) -> list:
    keys = sorted(points)
    best = [k for k in keys if not any(o[0] <= k[0] and o[1] <= k[1] and o != k for o in keys)]
    return [(f, b, points[(f, b)]) for f, b in best]


def word_front() -> dict[tuple[int, int], tuple]:
    """Pareto-best (fp16, bf16) instructions per word over layouts of 4 registers."""
    registers = _register_front()
    by_lowest: dict[int, list] = {}
    for residues, front in registers.items():
        by_lowest.setdefault(min(residues), []).append((residues, front))

    @functools.cache
    def solve(free: frozenset) -> dict[tuple[int, int], tuple]:
        if not free:
            return {(0, 0): ()}
        found: dict[tuple[int, int], tuple] = {}
        for residues, front in by_lowest[min(free)]:
            if not residues <= free:
                continue
            rest = solve(free - residues)
            for f, b, stored in front:
                for (f2, b2), layout in rest.items():
                    found.setdefault((f + f2, b + b2), (stored,) + layout)
        return {(f, b): layout for f, b, layout in _pareto(found)}

    return solve(frozenset(range(16)))


def current_costs() -> tuple[int, int]:
    """The repacked layout's (fp16, bf16) costs under the same recipes."""
    fp16 = bf16 = 0
    for magnitude, sign in CURRENT:
        stored = _targets((magnitude, magnitude + 1, magnitude + 2, sign))
        fp16 += register_cost(stored, FP16_TARGET)
        bf16 += register_cost(stored, BF16_TARGET)
    return fp16, bf16


def recipe(stored: tuple[int, ...], target: tuple[int, int, int, int]) -> tuple[int, ...]:
    """The arguments of `moe_mxfp4._moved` that move one register's 8 bits from `stored` to the
    lane target, by the cheapest recipe of `register_cost` (without the multiply's high half):
    (R0, M0, R1, M1, R2, M2, MUL), rotations R and masks M as int32 bit patterns."""
    targets = _targets(target)
    mask = sum(1 << p for p in stored)
    keep = sum(1 << q for q in targets)
    shifts = [q - p for p, q in zip(stored, targets, strict=True)]
    rotations = {(q - p) % 32 for p, q in zip(stored, targets, strict=True)}
    if len(rotations) > 1 and all(s >= 0 for s in shifts):
        multiplier = sum(1 << s for s in set(shifts))
        if multiplier < 2**32 and _carry_free(stored, targets, multiplier, False):
            return (0, _signed(mask), 0, _signed(keep), 0, 0, _signed(multiplier))
    terms = []  # (rotation, the target bits it fills), the unrotated term first
    for rotation in sorted(rotations):
        filled = [q for p, q in zip(stored, targets, strict=True) if (q - p) % 32 == rotation]
        terms.append((rotation, _signed(sum(1 << q for q in filled))))
    if len(terms) > 3:
        raise ValueError(f"{stored} needs {len(terms)} rotations; _moved takes 3")
    terms += [(0, 0)] * (3 - len(terms))
    return (*terms[0], *terms[1], *terms[2], 0)


def _signed(bits: int) -> int:
    return bits - 2**32 if bits >= 2**31 else bits


def _literal(value: int) -> str:
    return f"{'-' if value < 0 else ''}0x{abs(value):X}" if abs(value) > 64 else str(value)


def triton_table() -> str:
    """`moe_mxfp4._layout_lanes`'s body for the LANES_* layouts of gossamer/model/mxfp4.py."""
    from gossamer.kernels import moe_mxfp4 as moe
    from gossamer.model import mxfp4

    lines = []
    for name, registers in mxfp4.LANE_LAYOUTS.items():
        if name == mxfp4.LAYOUT_FP16_LANES:
            continue  # hand-written recipes (`_fp16_layout_lanes`, `_v2_fp16_layout_bits`)
        code = moe.layout_code_of(name)
        for bf16, target in ((False, FP16_TARGET), (True, BF16_TARGET)):
            for j, bits in enumerate(registers):
                stored = tuple(bits) + tuple((p + 16) % 32 for p in bits)
                args = ", ".join(_literal(a) for a in recipe(stored, target))
                cost = register_cost(stored, target)
                keyword = "if" if not lines else "elif"
                lane = "BF16" if bf16 else "not BF16"
                lines.append(f"    {keyword} LAYOUT == {code} and {lane} and J == {j}:  # {cost}")
                lines.append(f"        return _moved(words, {args})")
    lines += ["    else:", '        tl.static_assert(False, "no recipe for this LAYOUT")']
    return "\n".join(lines)


def main() -> None:
    if "--triton" in sys.argv:
        print(triton_table())
        return
    fp16, bf16 = current_costs()
    print(f"current layout (mxfp4.FP16_LANE_BITS): fp16 {fp16}, bf16 {bf16} instructions a word")
    print("Pareto front over the family (fp16, bf16; stored bits of each register):")
    for (fp16, bf16), layout in sorted(word_front().items()):
        print(f"  fp16 {fp16:2d}  bf16 {bf16:2d}  {layout}")


if __name__ == "__main__":
    main()
