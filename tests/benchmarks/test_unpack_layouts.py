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


def _run_recipe(recipe: tuple[int, ...], word: int) -> int:
    """What `moe_mxfp4._moved` computes from these arguments, on one 32-bit word."""
    r0, m0, r1, m1, r2, m2, multiplier = (value & 0xFFFFFFFF for value in recipe)

    def rotated(bits: int, r: int) -> int:
        return ((bits << r) | (bits >> (32 - r))) & 0xFFFFFFFF if r else bits

    if multiplier:
        return ((word & m0) * multiplier) & 0xFFFFFFFF & m1
    return (rotated(word, r0) & m0) | (rotated(word, r1) & m1) | (rotated(word, r2) & m2)


def test_recipes_move_each_register_of_each_layout_to_its_lanes(benchmark_script):
    """Every LANE_LAYOUTS register, both lane kinds, on random words and the extremes: exactly the
    register's 8 bits at the lanes' positions, nothing from the other registers."""
    import random

    from gossamer.model import mxfp4

    bench = benchmark_script("unpack_layouts")
    rng = random.Random(0)
    words = [rng.getrandbits(32) for _ in range(3000)] + [0, 0xFFFFFFFF]
    for registers in mxfp4.LANE_LAYOUTS.values():
        for bits in registers:
            stored = tuple(bits) + tuple((p + 16) % 32 for p in bits)
            for target in (bench.FP16_TARGET, bench.BF16_TARGET):
                recipe = bench.recipe(stored, target)
                lanes = bench._targets(target)
                for word in words:
                    want = sum(((word >> p) & 1) << q for p, q in zip(stored, lanes, strict=True))
                    assert _run_recipe(recipe, word) == want, (bits, target, hex(word))


def test_the_kernels_recipes_are_the_scripts(benchmark_script):
    """moe_mxfp4._layout_lanes holds what `unpack_layouts.py --triton` writes (rerun it and paste
    the output between the markers after changing mxfp4.LANE_LAYOUTS or the recipes)."""
    from gossamer.testing import REPO_ROOT

    source = (REPO_ROOT / "gossamer" / "kernels" / "moe_mxfp4.py").read_text()
    block = source.split("    # BEGIN generated recipes\n")[1].split("    # END generated recipes")[
        0
    ]
    assert block.rstrip("\n") == benchmark_script("unpack_layouts").triton_table()
