"""benchmarks/sass_counts.py's TTGIR reading (the compiles themselves need Triton's CUDA tools and
run by hand: `python benchmarks/sass_counts.py`)."""

from __future__ import annotations

import importlib
import sys

from gossamer.testing import REPO_ROOT

TTGIR = """#mma = #ttg.nvidia_mma<{versionMajor = 2, versionMinor = 0, warpsPerCTA = [4, 1]}>
#shared = #ttg.swizzled_shared<{vec = 16, perPhase = 1, maxPhase = 4, order = [1, 0]}>
#shared1 = #ttg.swizzled_shared<{vec = 1, perPhase = 1, maxPhase = 1, order = [5, 4, 3, 2, 1, 0]}>
#smem = #ttg.shared_memory
module {
  %a = ttg.local_alloc : () -> !ttg.memdesc<2x8x256xbf16, #shared, #smem, mutable>
}
"""


def _sass_counts():
    # NOTE: imported at run time: the module imports gossamer.kernels.moe_mxfp4, whose Triton
    # kernels must not be decorated at collection (tests/kernels/conftest.py runs them
    # interpreted; see tests/runner/test_warmup.py)
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    try:
        return importlib.import_module("sass_counts")
    finally:
        sys.path.remove(str(REPO_ROOT / "benchmarks"))


def test_shared_swizzles_lists_each_declared_encoding():
    assert _sass_counts().shared_swizzles(TTGIR) == ["16/1/4", "1/1/1"]


def test_shared_swizzles_of_a_kernel_without_shared_memory():
    assert _sass_counts().shared_swizzles("#blocked = #ttg.blocked<{}>\nmodule {}\n") == []


def test_programs_an_sm_by_registers_warps_and_blocks():
    programs_per_sm = _sass_counts().programs_per_sm
    assert programs_per_sm(76, 4) == 6  # 80 registers allocated: 65,536 / (80 x 128)
    assert programs_per_sm(48, 4) == 10
    assert programs_per_sm(16, 4) == 16  # 64 warps an SM
    assert programs_per_sm(16, 1) == 32  # 32 programs an SM
