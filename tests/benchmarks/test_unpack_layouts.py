"""benchmarks/unpack_layouts.py: the unpack cost model on the repacked layout and a moved one."""

from __future__ import annotations


def test_costs_of_known_registers(benchmark_script):
    bench = benchmark_script("unpack_layouts")
    in_place = bench._targets(bench.BF16_TARGET)
    assert bench.register_cost(in_place, bench.BF16_TARGET) == 1
    shifted = tuple(p - 3 for p in in_place)  # one shift moves all 8 bits
    assert bench.register_cost(shifted, bench.BF16_TARGET) == 2
    # magnitude and sign need different left shifts: one multiply, if no carry reaches a kept bit
    split = bench._targets((0, 1, 2, 13))
    assert bench.register_cost(split, bench.FP16_TARGET) == 3
    assert bench.current_costs() == (9, 13)  # moe_mxfp4's recipes: 9 and 12 (one shared shift)
