"""benchmarks/sass_barriers.py: control bits decoded from an nvdisasm -hex listing."""

from __future__ import annotations

# two instructions of the 8-row gate_up (triton 3.6, sm_90): an LDG setting write barrier 2, and
# an instruction waiting on barrier 3
LISTING = """
        /*1330*/              @!P0 LDG.E.U8 R7, desc[UR14][R32.64] ;                             /* 0x0000000e20078981 */
                                                                                                 /* 0x000ea2000c1e1100 */
        /*1460*/                   LDS.128 R20, [R52+UR11+0x4000] ;                              /* 0x0040000b34147984 */
                                                                                                 /* 0x008ee80008000c00 */
"""


def test_decode_barriers(benchmark_script):
    bench = benchmark_script("sass_barriers")
    ldg, lds = bench.decode(LISTING)
    assert ldg["address"] == 0x1330 and ldg["text"].startswith("@!P0 LDG.E.U8")
    assert ldg["write"] == 2 and ldg["read"] is None and ldg["wait"] == []
    assert lds["write"] == 3 and lds["wait"] == [3]
