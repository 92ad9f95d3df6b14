"""benchmarks/wgmma_hazards.py: writes to the A registers of wgmmas that may still run, found in
SASS text (synthetic listings shaped like nvdisasm's; the script's compile needs triton 3.6)."""

from __future__ import annotations

import pytest


@pytest.fixture
def checker(benchmark_script):
    return benchmark_script("wgmma_hazards")


def listing(*instructions: str) -> list[str]:
    """A loop as nvdisasm prints it (the label line, then addressed instructions)."""
    lines = [".L_x_0:"]
    for i, text in enumerate(instructions):
        lines.append(f"        /*{16 * i:04x}*/                   {text} ;")
    return lines


def test_a_write_after_the_back_edge_is_a_hazard(checker):
    """Two HGMMAs, a wait that lets one run on, and the loop's start rewriting the registers of
    the one left running: found in the second pass only (the first has nothing in flight)."""
    body = checker.loop_body(listing(
        "LOP3.LUT R40, R1, 0xf, RZ, 0xc0, !PT",  # HGMMA #1's register: #1 was waited for
        "IMAD R44, R2, 0x1040, RZ",
        "WARPGROUP.ARRIVE",
        "HGMMA.64x32x16.F32.BF16 R24, R40, gdesc[UR8], R24, gsb0",
        "WARPGROUP.DEPBAR.LE gsb0, 0x1",
        "HGMMA.64x32x16.F32.BF16 R24, R44, gdesc[UR8], R24, gsb0",
        "WARPGROUP.DEPBAR.LE gsb0, 0x1",
        "@!P0 BRA `(.L_x_0)",
    ))  # fmt: skip
    found = checker.hazards(body)
    assert found == ["IMAD R44 written while HGMMA #2 (R44..R47) may run"]


def test_a_full_wait_before_the_branch_leaves_none(checker):
    body = checker.loop_body(listing(
        "IMAD R44, R2, 0x1040, RZ",
        "HGMMA.64x32x16.F32.BF16 R24, R40, gdesc[UR8], R24",
        "HGMMA.64x32x16.F32.BF16 R24, R44, gdesc[UR8], R24, gsb0",
        "WARPGROUP.DEPBAR.LE gsb0, 0x0",
        "LDS.128 R40, [R35+0x3000]",  # after the wait: fine
        "@!P0 BRA `(.L_x_0)",
    ))  # fmt: skip
    assert checker.hazards(body) == []


def test_writes_and_non_writes(checker):
    assert checker.written_registers("LDS.128", "R40, [R35+0x3000]") == {40, 41, 42, 43}
    assert checker.written_registers("IMAD.WIDE", "R2, R3, 0x4, R4") == {2, 3}
    assert checker.written_registers("STS.128", "[R1], R40") == set()
    assert checker.written_registers("HGMMA.64x32x16.F32.BF16", "R24, R40, gdesc[UR8]") == set()
    # an smem A operand (a descriptor, not registers) starts no register hazard
    body = checker.loop_body(listing("HGMMA.64x32x16.F32.BF16 R24, gdesc[UR4], R24, gsb0",
                                     "IMAD R40, R2, 0x1, RZ"))  # fmt: skip
    assert checker.hazards(body) == []
