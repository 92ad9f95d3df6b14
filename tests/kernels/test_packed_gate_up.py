"""The batch-1 gate_up GEMV reading gate_up packed by program (moe_mxfp4.PACKED_GATE_UP,
pack_gate_up / register_packed_gate_up, off by default) against the same kernel reading the
row-major weights: the same bits. CPU tests run interpreted in float32 on tiny shapes (hidden 160:
5 scale groups, so partial steps; intermediate 96); the GPU test runs gpt-oss-20b's expert shapes.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.kernels.interpreted import kernel_fixture
from tests.kernels.test_moe_mxfp4 import (
    ALPHA,
    LIMIT,
    TINY_FP16,
    _experts,
    _fp16_lanes,
    _inputs,
)

moe = kernel_fixture("moe_mxfp4")
GROUPS_PER_STEP = TINY_FP16["gate_up_config"]["GROUPS_PER_STEP"]  # 2


def test_pack_gate_up_puts_each_programs_step_in_one_run(moe):
    experts = _experts(3, 160, 96, seed=5)  # 192 rows of 5 groups
    words, scales = moe.pack_gate_up(experts.gate_up_blocks, experts.gate_up_scales, 64, 2)
    assert words.shape == (3, 2, 3, 128, 8) and words.dtype == torch.int32
    assert scales.shape == (3, 2, 3, 128, 2) and scales.dtype == torch.uint8
    rows = experts.gate_up_blocks.view(torch.int32)  # [3, 192, 5, 4]
    for e, b, s in [(0, 0, 0), (2, 1, 2), (1, 1, 1)]:
        r0, g0 = 128 * b, 2 * s
        n, groups = min(128, 192 - r0), min(2, 5 - g0)
        assert torch.equal(
            words[e, b, s, :n, : 4 * groups], rows[e, r0 : r0 + n, g0 : g0 + groups].flatten(1)
        )
        assert torch.equal(
            scales[e, b, s, :n, :groups], experts.gate_up_scales[e, r0 : r0 + n, g0 : g0 + groups]
        )
        # past the rows' and the groups' ends: zeros (never read)
        assert not words[e, b, s, n:].any() and not words[e, b, s, :, 4 * groups :].any()


def _config(block_pairs: int, **gate_up) -> dict:
    return {
        "gate_up_config": TINY_FP16["gate_up_config"] | {"BLOCK_PAIRS": block_pairs, **gate_up},
        "down_config": dict(TINY_FP16["down_config"]),
    }


@pytest.fixture
def packed_on(moe, monkeypatch):
    monkeypatch.setattr(moe, "PACKED_GATE_UP", True)
    yield
    moe.clear_packed_gate_up()


@pytest.mark.parametrize("tokens,block_pairs", [(2, 64), (1, 16)])  # 64 pairs: a padded block
def test_packed_gate_up_gives_the_row_major_bits(moe, packed_on, tokens, block_pairs):
    experts = _fp16_lanes(_experts(8, 160, 96, seed=60))
    other = _fp16_lanes(_experts(8, 160, 96, seed=61))
    x, logits = _inputs(tokens, 160, 8, seed=62 + tokens)
    config = _config(block_pairs)
    plain = moe.moe_mxfp4_decode_fp16(x, logits, experts, 4, LIMIT, ALPHA, **config)
    moe.register_packed_gate_up(experts, block_pairs, GROUPS_PER_STEP)
    assert torch.equal(
        moe.moe_mxfp4_decode_fp16(x, logits, experts, 4, LIMIT, ALPHA, **config), plain
    )
    # the copy is what the kernel reads: another expert set's copy under this key gives its bits
    key = (experts.gate_up_blocks.data_ptr(), block_pairs, GROUPS_PER_STEP)
    words, scales = moe.pack_gate_up(
        other.gate_up_blocks, other.gate_up_scales, block_pairs, GROUPS_PER_STEP
    )
    moe._PACKED_GATE_UP[key] = moe.PackedGateUp(words, scales, moe._PACKED_GATE_UP[key].source)
    swapped = dataclasses.replace(
        experts, gate_up_blocks=other.gate_up_blocks, gate_up_scales=other.gate_up_scales
    )
    expected = moe.moe_mxfp4_decode_fp16(x, logits, swapped, 4, LIMIT, ALPHA, **config)
    assert not torch.equal(expected, plain)
    assert torch.equal(
        moe.moe_mxfp4_decode_fp16(x, logits, experts, 4, LIMIT, ALPHA, **config), expected
    )
    # ...but not with another tile, split K or EARLY (their plans read the row-major weights)
    for changed in ({"BLOCK_PAIRS": 32}, {"SPLIT_K": 2}, {"EARLY": 1})[: 3 if tokens == 1 else 0]:
        config = _config(block_pairs, **changed)
        reference = moe.moe_mxfp4_decode_fp16(x, logits, experts, 4, LIMIT, ALPHA, **config)
        moe.PACKED_GATE_UP = False
        try:
            assert torch.equal(
                moe.moe_mxfp4_decode_fp16(x, logits, experts, 4, LIMIT, ALPHA, **config), reference
            )
        finally:
            moe.PACKED_GATE_UP = True


def test_packed_gate_up_routes_in_the_experts_too(moe, packed_on):
    """moe_from_logits (no routing kernel) with the default tile reads the copy alike."""
    experts = _fp16_lanes(_experts(8, 160, 96, seed=70))
    x, logits = _inputs(1, 160, 8, seed=71)
    _, _, x_h, x_unscale = moe.route_fp16(logits, 4, x)
    plain = moe.moe_from_logits(x, x_h, x_unscale, logits, experts, 4, LIMIT, ALPHA)
    config = moe.DECODE_FP16_GATE_UP
    moe.register_packed_gate_up(experts, config["BLOCK_PAIRS"], config["GROUPS_PER_STEP"])
    assert moe._packed_gate_up(experts, config | {"EARLY": 0}) is not None
    assert torch.equal(
        moe.moe_from_logits(x, x_h, x_unscale, logits, experts, 4, LIMIT, ALPHA), plain
    )


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 8])
def test_gpu_packed_gate_up_gives_the_row_major_bits(tokens):
    """gpt-oss-20b's expert shapes in bf16, the default tile: packed and row-major alike."""
    from gossamer.kernels import moe_mxfp4 as gpu_moe
    from tests.kernels.test_route_in_experts import _random_packed_experts

    experts = _random_packed_experts(32, 2880, 2880, seed=80)
    g = torch.Generator(device="cuda").manual_seed(81)
    x = torch.randn(tokens, 2880, generator=g, device="cuda").to(torch.bfloat16)
    logits = torch.randn(tokens, 32, generator=g, device="cuda").to(torch.bfloat16)
    plain = gpu_moe.moe_mxfp4_decode_fp16(x, logits, experts, 4, LIMIT, ALPHA)
    config = gpu_moe.DECODE_FP16_GATE_UP
    gpu_moe.register_packed_gate_up(experts, config["BLOCK_PAIRS"], config["GROUPS_PER_STEP"])
    previous, gpu_moe.PACKED_GATE_UP = gpu_moe.PACKED_GATE_UP, True
    try:
        assert gpu_moe._packed_gate_up(experts, config | {"EARLY": 0}) is not None
        assert torch.equal(
            gpu_moe.moe_mxfp4_decode_fp16(x, logits, experts, 4, LIMIT, ALPHA), plain
        )
    finally:
        gpu_moe.PACKED_GATE_UP = previous
        gpu_moe.clear_packed_gate_up()
