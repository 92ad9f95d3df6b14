"""gossamer/kernels/moe_gluon.py: prefill's MXFP4 MoE in Gluon.

Gluon does not run under TRITON_INTERPRET, so on the CPU the kernels are compiled for sm_90 (in a
process of their own, as test_sm90_compile.py does) and their loop checked: the dequantization
overlaps the wgmmas, nothing writes an in-flight operand register, nothing spills. On a Hopper GPU
(`-m gpu`) they run against the torch reference and v2.
"""

from __future__ import annotations

import json

import pytest
import torch

from gossamer.model import mxfp4
from gossamer.testing import run_compiling
from tests.kernels.test_moe_mxfp4 import (
    ALPHA,
    LIMIT,
    _experts,
    _fp16_lanes,
    _inputs,
    _reference,
    _relative_error,
)

SASS_SCRIPT = "import json, gluon_moe_sass; print(json.dumps(gluon_moe_sass.main()))"


def test_kernels_compile_for_sm90_and_overlap_the_dequantization():
    done = run_compiling(SASS_SCRIPT)
    if done.returncode != 0:
        pytest.fail(f"compile for sm_90 failed:\n{done.stderr[-3000:]}")
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    assert {(r["kernel"], r["block_m"]) for r in rows} == {
        (k, m) for k in ("gate_up", "down") for m in (64, 128)
    }
    for row in rows:
        assert row["hgmma"] == 8, row  # one step: 8 of k16 (128 K positions), in two halves
        assert row["hazards"] == [] and row["local_memory"] == 0, row
        # each half's wgmmas have work beside them (the next half's unpack, loads, copies)
        assert len(row["in_flight"]) == 2 and min(row["in_flight"]) > 16, row
    # 64-token tiles of 8 warps fit two programs an SM (at most 128 registers a thread)
    assert all(r["registers"] <= 128 for r in rows if r["block_m"] == 64), rows


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


on_hopper = pytest.mark.skipif(not _hopper(), reason="needs a Hopper GPU")


def _gluon_and_v2(x, logits, experts, top_k, block_m, warps=8):
    """(the Gluon kernels' output, v2's at its 64-row prefill tile) for the same call."""
    from gossamer.kernels import moe_gluon
    from gossamer.kernels import moe_mxfp4 as moe

    out = moe_gluon.moe_mxfp4_gluon(x, logits, experts, top_k, LIMIT, ALPHA, block_m, warps)
    v2 = moe.moe_mxfp4_grouped_v2(x, logits, experts, top_k, LIMIT, ALPHA, block_m=64)
    return out, v2


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize(
    "layout,block_m,warps",
    [(layout, 64, 8) for layout in (mxfp4.LAYOUT_HF, *sorted(mxfp4.LANE_LAYOUTS))]
    + [(mxfp4.gpu_layout(), 128, 8), (mxfp4.gpu_layout(), 64, 4)],
)
def test_matches_reference_with_partial_steps_and_tiles(layout, block_m, warps):
    """Both K sizes end in a partial step (576 = 4 steps + 2 groups, 320 = 2 steps + 2 groups);
    expert 3 is every token's first pick (a full tile and a partial one), the others partial."""
    experts = _experts(8, 576, 320, seed=70 + block_m)
    if layout != mxfp4.LAYOUT_HF:
        experts = _fp16_lanes(experts, layout)
    x, logits = _inputs(block_m + 7, 576, 8, seed=71)
    logits[:, 3] += 50.0
    x = x.to(torch.bfloat16)
    out, v2 = _gluon_and_v2(x, logits, experts, 2, block_m, warps)
    assert out.dtype == torch.bfloat16 and bool(torch.isfinite(out).all())
    assert _relative_error(out, _reference(x, logits, experts, 2)) < 2e-2
    assert _relative_error(out, v2.float()) < 1e-2


@pytest.mark.gpu
@on_hopper
@pytest.mark.parametrize("tokens,block_m", [(700, 64), (2048, 128)])
def test_matches_reference_at_120b_shapes(tokens, block_m):
    """gpt-oss-120b's expert shapes (hidden = intermediate = 2880, top 4) in the loader's word
    layout, 8 experts (quantizing 128 on the CPU takes minutes); one left without tokens."""
    experts = _fp16_lanes(_experts(8, 2880, 2880, seed=72), mxfp4.gpu_layout())
    x, logits = _inputs(tokens, 2880, 8, seed=73)
    logits[:, 5] = -1e4
    x = x.to(torch.bfloat16)
    out, v2 = _gluon_and_v2(x, logits, experts, 4, block_m)
    assert _relative_error(out, _reference(x, logits, experts, 4)) < 2e-2
    assert _relative_error(out, v2.float()) < 1e-2


@pytest.mark.gpu
@on_hopper
def test_prefill_tiles_take_the_gluon_kernels_when_switched_on(monkeypatch):
    """moe_mxfp4_grouped_v2 hands its 64-row tiles to the Gluon kernels with GLUON_PREFILL, and
    keeps smaller tiles (decode) on v2."""
    from gossamer.kernels import moe_gluon
    from gossamer.kernels import moe_mxfp4 as moe

    calls = []
    real = moe_gluon.moe_mxfp4_gluon
    monkeypatch.setattr(moe_gluon, "moe_mxfp4_gluon",
                        lambda *a, **kw: calls.append(a[-1]) or real(*a, **kw))  # fmt: skip
    monkeypatch.setattr(moe, "GLUON_PREFILL", True)
    experts = _fp16_lanes(_experts(8, 576, 320, seed=74))
    for tokens in (8, 400):  # 2 and 100 pairs an expert: 8-row v2 tiles, then 64-row ones
        x, logits = _inputs(tokens, 576, 8, seed=75)
        x = x.to(torch.bfloat16)
        out = moe.moe_mxfp4(x, logits, experts, 2, LIMIT, ALPHA)
        assert _relative_error(out, _reference(x, logits, experts, 2)) < 2e-2
    assert calls == [64]


@pytest.mark.gpu
@on_hopper
def test_no_tokens_and_bad_problems():
    from gossamer.kernels import moe_gluon
    from gossamer.kernels import moe_mxfp4 as moe

    experts = _experts(8, 576, 320, seed=76)
    x, logits = _inputs(0, 576, 8, seed=77)
    out = moe_gluon.moe_mxfp4_gluon(x.to(torch.bfloat16), logits, experts, 2, LIMIT, ALPHA)
    assert out.shape == (0, 576)
    x, logits = _inputs(4, 576, 8, seed=77)
    with pytest.raises(moe.MoEShapeError, match="Gluon"):
        moe_gluon.moe_mxfp4_gluon(x, logits, experts, 2, LIMIT, ALPHA)  # fp32 x
    small = _experts(8, 96, 64, seed=78)  # K below two whole steps
    x, logits = _inputs(4, 96, 8, seed=79)
    with pytest.raises(moe.MoEShapeError, match="Gluon"):
        moe_gluon.moe_mxfp4_gluon(x.to(torch.bfloat16), logits, small, 2, LIMIT, ALPHA)
