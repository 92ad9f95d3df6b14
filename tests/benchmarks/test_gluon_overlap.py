"""benchmarks/gluon_overlap.py: compiled for sm_90 on this CPU machine (in a process of its own,
as tests/kernels/test_sm90_compile.py does: this one imported Triton in interpreter mode), the
async wgmma with its register operand kept alive lets the next step's unpack run before the wait,
without writing the in-flight registers; the synchronous loop unpacks only after the wait."""

from __future__ import annotations

import json

import pytest

from gossamer.testing import run_compiling

SCRIPT = "import json, gluon_overlap; print(json.dumps(gluon_overlap.main()))"


def test_async_wgmma_overlaps_the_next_unpack_without_hazards():
    done = run_compiling(SCRIPT)
    if done.returncode != 0:
        pytest.fail(f"the probe failed:\n{done.stderr[-3000:]}")
    waited, overlapped = json.loads(done.stdout.strip().splitlines()[-1])
    assert not waited["overlap"] and overlapped["overlap"]
    assert waited["unpack_in_flight"] == 0
    assert overlapped["unpack_in_flight"] > overlapped["unpack_total"] // 2
    assert waited["hazards"] == [] and overlapped["hazards"] == []
