"""MXFP4 MoE kernels (gossamer/kernels/moe_mxfp4.py) against TorchOps().moe.

CPU tests run the kernels in the Triton interpreter on tiny fp32/fp16 problems (hidden 96 so that a
row's 3 scale groups leave a partial step, intermediate 64), covering routing, both paths (GEMV for
decode, grouped GEMM), experts with no tokens, every token on the same experts (several M-tiles of
one expert), odd token counts and dense experts, for the grouped v1 and v2 kernels (v2's bf16-lane arithmetic
runs emulated on the CPU). The oracle is the torch reference computed in fp32
from the same packed weights. GPU tests (`-m gpu`) use gpt-oss-120b shapes in bf16.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from gossamer.model import mxfp4
from gossamer.ops.base import ExpertWeights
from gossamer.ops.torch_ref import TorchOps
from tests.kernels.interpreted import DEVICE, kernel_fixture, kernel_module

moe = kernel_fixture("moe_mxfp4")

LIMIT, ALPHA = 7.0, 1.702
# Small tiles keep the interpreter fast while still leaving partial steps and several programs.
TINY_DECODE = {
    "gate_up_config": {"BLOCK_PAIRS": 64, "GROUPS_PER_STEP": 4, "num_warps": 4},
    "down_config": {"BLOCK_ROWS": 64, "GROUPS_PER_STEP": 4, "num_warps": 2},
}
TINY_GROUPED = {
    "block_m": 16,
    "gate_up_config": {"BLOCK_PAIRS": 32, "GROUPS_PER_STEP": 2, "num_warps": 4},
    "down_config": {"BLOCK_COLS": 64, "GROUPS_PER_STEP": 2, "num_warps": 4},
}


def _experts(
    num_experts: int, hidden: int, inter: int, seed: int, device: str = DEVICE
) -> ExpertWeights:
    """Packed experts quantized from random fp32 matrices (real scale spread), fp32 biases."""
    g = torch.Generator().manual_seed(seed)
    gate_up = torch.randn(num_experts, 2 * inter, hidden, generator=g) / hidden**0.5
    down = torch.randn(num_experts, hidden, inter, generator=g) / inter**0.5
    gate_up_blocks, gate_up_scales = mxfp4.quantize(gate_up)
    down_blocks, down_scales = mxfp4.quantize(down)
    return ExpertWeights(
        gate_up_bias=(0.1 * torch.randn(num_experts, 2 * inter, generator=g)).to(device),
        down_bias=(0.1 * torch.randn(num_experts, hidden, generator=g)).to(device),
        gate_up_blocks=gate_up_blocks.to(device),
        gate_up_scales=gate_up_scales.to(device),
        down_blocks=down_blocks.to(device),
        down_scales=down_scales.to(device),
    )


def _dense(experts: ExpertWeights) -> ExpertWeights:
    """The same experts, dequantized to fp32 dense matrices."""
    return ExpertWeights(
        gate_up_bias=experts.gate_up_bias,
        down_bias=experts.down_bias,
        gate_up_dense=mxfp4.dequantize(
            experts.gate_up_blocks, experts.gate_up_scales, torch.float32
        ),
        down_dense=mxfp4.dequantize(experts.down_blocks, experts.down_scales, torch.float32),
    )


def _inputs(tokens: int, hidden: int, num_experts: int, seed: int, device: str = DEVICE):
    g = torch.Generator().manual_seed(seed)
    x = (2.0 * torch.randn(tokens, hidden, generator=g)).to(device)
    logits = torch.randn(tokens, num_experts, generator=g).to(device)
    return x, logits


def _reference(x, logits, experts: ExpertWeights, top_k: int) -> torch.Tensor:
    """TorchOps().moe in fp32 (biases too) from the same weights."""
    fp32 = dataclasses.replace(
        experts,
        gate_up_bias=experts.gate_up_bias.float(),
        down_bias=experts.down_bias.float(),
    )
    return TorchOps().moe(x.float(), logits.float(), fp32, top_k, LIMIT, ALPHA)


def _relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).abs().max() / ref.abs().max()).item()


def _fp16_lanes(experts: ExpertWeights, layout: str = mxfp4.LAYOUT_FP16_LANES) -> ExpertWeights:
    """The same experts with their blocks repacked to a GPU layout (model/mxfp4.py), by default
    the loader's."""
    return dataclasses.replace(
        experts,
        gate_up_blocks=mxfp4.repack(experts.gate_up_blocks, mxfp4.LAYOUT_HF, layout),
        down_blocks=mxfp4.repack(experts.down_blocks, mxfp4.LAYOUT_HF, layout),
        layout=layout,
    )


GPU_LAYOUTS = sorted(mxfp4.LANE_LAYOUTS)  # every layout the Triton kernels unpack besides HF


# ------------------------------------------------------------------------------------------------
# Routing
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_experts,top_k", [(8, 3), (6, 1), (5, 5)])
def test_route_matches_topk_softmax(moe, num_experts, top_k):
    x, logits = _inputs(7, 32, num_experts, seed=num_experts)
    ids, weights, x_planes = moe.route(logits, top_k, x)
    ref_ids, ref_weights = moe.route_reference(logits, top_k)
    assert torch.equal(ids.cpu(), ref_ids.cpu())
    torch.testing.assert_close(weights, ref_weights, atol=1e-6, rtol=1e-6)
    # nibble planes: plane i holds x[:, i::8]
    expected_planes = x.float().view(7, 32 // 8, 8).transpose(1, 2)
    assert torch.equal(x_planes, expected_planes)
    # paired K order: in each run of 8, position 2j + h holds element j + 4h
    _, _, x_paired = moe.route(logits, top_k, x, x_layout="paired")
    expected_paired = x.view(7, 4, 2, 4).transpose(2, 3).reshape(7, 32)
    assert torch.equal(x_paired, expected_paired)


def test_route_ties_go_to_the_lower_expert(moe):
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0]], device=DEVICE)
    ids, weights, _ = moe.route(logits, 2)
    assert ids.tolist() == [1, 2]
    torch.testing.assert_close(weights.cpu(), torch.tensor([0.5, 0.5]))


@pytest.mark.parametrize("num_experts,top_k", [(128, 4), (32, 4), (5, 5)])
def test_route_by_packed_keys_gives_the_same_bits(moe, monkeypatch, num_experts, top_k):
    """TOP_K_KEYS (one int64 max a slot) against the two-reduction top-k: the same ids and weights,
    bit for bit, with ties, logits below -2 (negative floats order by flipped bits) and -inf.
    (Fewer finite logits than top_k is left out: there the old top-k repeats expert 0.)"""
    g = torch.Generator().manual_seed(num_experts)
    logits = torch.randn(6, num_experts, generator=g) * 4
    logits[0, :3] = logits[0].max()  # a three-way tie for the top
    logits[1] = -torch.rand(num_experts, generator=g) * 50 - 2.0  # all below -2
    logits[2, top_k:] = float("-inf")  # (padding's value; never chosen while a finite one is left)
    logits[3, top_k - 1 :] = logits[3, 0]  # ties at the last slot taken
    logits[4] = torch.where(torch.arange(num_experts) % 2 == 0, -0.0, 0.0)  # a tie of -0.0 and +0.0
    logits[4, num_experts - 1] = -1.0
    logits = logits.to(DEVICE)
    monkeypatch.setattr(moe, "TOP_K_KEYS", False)
    ids, weights, _ = moe.route(logits, top_k)
    monkeypatch.setattr(moe, "TOP_K_KEYS", True)
    key_ids, key_weights, _ = moe.route(logits, top_k)
    assert torch.equal(key_ids, ids) and torch.equal(key_weights, weights)
    for row, got in zip(logits.cpu().tolist(), key_ids.view(6, top_k).tolist(), strict=True):
        order = sorted(range(num_experts), key=lambda e: (-row[e], e))  # ties: the lower expert
        assert got == order[:top_k]


# ------------------------------------------------------------------------------------------------
# Both paths against the reference
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tokens", [1, 3, 17])
def test_decode_path_matches_reference(moe, tokens):
    experts = _experts(8, 96, 64, seed=1)
    x, logits = _inputs(tokens, 96, 8, seed=tokens)
    out = moe.moe_mxfp4_decode(x, logits, experts, 4, LIMIT, ALPHA, **TINY_DECODE)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert _relative_error(out, _reference(x, logits, experts, 4)) < 1e-5


# The packed-fp16 GEMV rounds products and in-group sums to fp16: about 5e-4 relative (rms) on
# random data; the bound below is the max element error over the output, against fp32.
FP16_TOLERANCE = 4e-3
TINY_FP16 = {
    "gate_up_config": {"BLOCK_PAIRS": 32, "GROUPS_PER_STEP": 2, "SPLIT_K": 1, "num_warps": 4},
    "down_config": {"BLOCK_ROWS": 32, "GROUPS_PER_STEP": 2, "SPLIT_K": 1, "num_warps": 4},
}


def _with_split(config: dict, gate_up: int, down: int) -> dict:
    return {
        "gate_up_config": config["gate_up_config"] | {"SPLIT_K": gate_up},
        "down_config": config["down_config"] | {"SPLIT_K": down},
    }


@pytest.mark.parametrize(
    "tokens,split,stages",
    [(1, (1, 1), 0), (3, (1, 1), 0), (1, (2, 1), 0), (3, (3, 2), 0), (3, (2, 1), 3)],
)
def test_fp16_decode_path_matches_reference(moe, tokens, split, stages):
    """Hidden 160 (5 groups) and intermediate 96 (3 groups): partial steps, uneven split-K chunks
    (5 = 1 + 2 + 2, 3 = 1 + 2), blocks past the end of the rows, both loop forms."""
    experts = _experts(8, 160, 96, seed=50)
    x, logits = _inputs(tokens, 160, 8, seed=51 + tokens)
    config = _with_split(TINY_FP16, *split)
    for kernel_config in config.values():
        kernel_config["NUM_STAGES"] = stages  # 0: register double buffer; 3: tl.range pipelining
    out = moe.moe_mxfp4_decode_fp16(x, logits, experts, 4, LIMIT, ALPHA, **config)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert _relative_error(out, _reference(x, logits, experts, 4)) < FP16_TOLERANCE


@pytest.mark.parametrize("tokens,split,repacked", [(1, (1, 1), True), (3, (3, 2), False)])
def test_fp16_down_loads_a_step_ahead(moe, tokens, split, repacked):
    """down's AHEAD 2 (scales and activation words loaded a step early) computes the same
    products in the same order as the register double buffer: bit-equal outputs, partial steps
    and uneven split-K chunks included, on both bit layouts."""
    experts = _experts(8, 160, 96, seed=54)
    experts = _fp16_lanes(experts) if repacked else experts
    x, logits = _inputs(tokens, 160, 8, seed=55 + tokens)
    config = _with_split(TINY_FP16, *split)
    out = moe.moe_mxfp4_decode_fp16(x, logits, experts, 4, LIMIT, ALPHA, **config)
    config["down_config"]["AHEAD"] = 2
    ahead = moe.moe_mxfp4_decode_fp16(x, logits, experts, 4, LIMIT, ALPHA, **config)
    assert torch.equal(ahead, out)
    assert _relative_error(ahead, _reference(x, logits, experts, 4)) < FP16_TOLERANCE
    config["down_config"]["EARLY"] = 1  # the first step's words and scales before the PDL wait
    assert torch.equal(
        moe.moe_mxfp4_decode_fp16(x, logits, experts, 4, LIMIT, ALPHA, **config), out
    )


@pytest.mark.parametrize(
    "tokens,split,stages,repacked",
    [(1, (1, 1), 0, True), (3, (2, 1), 0, False), (3, (1, 1), 3, True)],
)
def test_fp16_gate_up_scales_through_transposed_pointers(moe, tokens, split, stages, repacked):
    """gate_up's SCALES_T (the scales' load laid out like the group sums) loads the same scales
    and sums the same products in the same order: bit-equal outputs, with partial steps, split-K
    chunks and both loop forms."""
    experts = _experts(8, 160, 96, seed=57)
    experts = _fp16_lanes(experts) if repacked else experts
    x, logits = _inputs(tokens, 160, 8, seed=58 + tokens)
    config = _with_split(TINY_FP16, *split)
    config["gate_up_config"]["NUM_STAGES"] = stages
    out = moe.moe_mxfp4_decode_fp16(x, logits, experts, 4, LIMIT, ALPHA, **config)
    config["gate_up_config"]["SCALES_T"] = 1
    transposed = moe.moe_mxfp4_decode_fp16(x, logits, experts, 4, LIMIT, ALPHA, **config)
    assert torch.equal(transposed, out)
    assert _relative_error(out, _reference(x, logits, experts, 4)) < FP16_TOLERANCE


@pytest.mark.parametrize(
    "hidden,inter,tokens,unroll,early,scales_t",
    [(160, 96, 1, 1, 0, 0), (160, 96, 3, 2, 1, 1), (160, 96, 2, 4, 0, 0), (128, 64, 1, 1, 1, 1),
     (128, 64, 3, 3, 0, 0), (160, 96, 2, 4, 0, 1)],
)  # fmt: skip
def test_fp16_whole_steps_give_the_same_bits(moe, hidden, inter, tokens, unroll, early, scales_t):
    """WHOLE_STEPS (whole steps loaded unmasked, the loop unrolled): the same products in the same
    order as the masked loop, so the same bits, with a partial last step (hidden 160: 5 groups in
    steps of 2; intermediate 96: 3) and without one (128 / 64), the first step loaded before the
    PDL wait or after it, unroll factors that do and do not divide the whole steps, and gate_up's
    scales through transposed pointers (SCALES_T) or not."""
    experts = _fp16_lanes(_experts(8, hidden, inter, seed=61))
    x, logits = _inputs(tokens, hidden, 8, seed=62 + tokens)
    config = {name: dict(c) for name, c in TINY_FP16.items()}
    config["down_config"] |= {"AHEAD": 2, "EARLY": early}
    config["gate_up_config"] |= {"EARLY": early, "SCALES_T": scales_t}
    out = moe.moe_mxfp4_decode_fp16(x, logits, experts, 4, LIMIT, ALPHA, **config)
    for name in config:
        config[name]["WHOLE_STEPS"] = unroll
    whole = moe.moe_mxfp4_decode_fp16(x, logits, experts, 4, LIMIT, ALPHA, **config)
    assert torch.equal(whole, out)
    assert _relative_error(whole, _reference(x, logits, experts, 4)) < FP16_TOLERANCE


@pytest.mark.parametrize(
    "tokens,prefetch,early,unroll,pairs",
    [(1, 1, 0, 0, 32), (3, 2, 0, 2, 32), (2, 2, 1, 1, 32), (1, 2, 0, 0, 64), (3, 1, 1, 2, 64)],
)
def test_fp16_gate_up_prefetch_to_l2_changes_no_bit(moe, tokens, prefetch, early, unroll, pairs):
    """gate_up's PREFETCH_L2 (its rows' scales, or scales and words, asked into L2 as a program
    starts; skipped by the interpreter) only adds hints: the same bits, with every row real
    (intermediate 96 in blocks of 32 pairs: the whole-step loop) or the last program's rows past
    the end (blocks of 64: its block clamped to the expert's 192 rows; the masked loop), and the
    expert known before or after the PDL wait."""
    experts = _fp16_lanes(_experts(8, 160, 96, seed=63))
    x, logits = _inputs(tokens, 160, 8, seed=64 + tokens)
    config = {name: dict(c) for name, c in TINY_FP16.items()}
    config["gate_up_config"] |= {"EARLY": early, "WHOLE_STEPS": unroll, "BLOCK_PAIRS": pairs}
    out = moe.moe_mxfp4_decode_fp16(x, logits, experts, 4, LIMIT, ALPHA, **config)
    config["gate_up_config"]["PREFETCH_L2"] = prefetch
    prefetched = moe.moe_mxfp4_decode_fp16(x, logits, experts, 4, LIMIT, ALPHA, **config)
    assert torch.equal(prefetched, out)
    assert _relative_error(prefetched, _reference(x, logits, experts, 4)) < FP16_TOLERANCE


def test_fp16_gate_up_prefetch_to_l2_needs_one_k_split(moe):
    """The prefetch covers whole rows, so a split-K gate_up refuses it; so do unknown values."""
    experts = _experts(8, 160, 96, seed=65)
    x, logits = _inputs(1, 160, 8, seed=66)
    for changes in ({"PREFETCH_L2": 1, "SPLIT_K": 2}, {"PREFETCH_L2": 3}):
        config = {name: dict(c) for name, c in TINY_FP16.items()}
        config["gate_up_config"] |= changes
        with pytest.raises(moe.MoEShapeError, match="PREFETCH_L2"):
            moe.moe_mxfp4_decode_fp16(x, logits, experts, 4, LIMIT, ALPHA, **config)


@pytest.mark.parametrize("rows,row_bytes", [(32, 90), (32, 1440), (2, 5), (4, 64)])
def test_row_block_lines_cover_any_alignment(moe, rows, row_bytes):
    """A block of rows x row_bytes bytes starting anywhere in a line touches at most
    cdiv(bytes, 128) + 1 lines; the prefetch's LINES is at least that, a power of two."""
    lines = moe.row_block_lines(rows, row_bytes)
    worst = max(len({(start + b) // 128 for b in range(rows * row_bytes)}) for start in range(128))
    assert lines >= worst and lines & (lines - 1) == 0


@pytest.mark.parametrize(
    "gate_up,down,rows,groups",
    [
        ({}, {}, True, 5),  # both take it
        ({"SPLIT_K": 2}, {"SPLIT_K": 2}, True, 5),  # K split across programs
        ({"NUM_STAGES": 3}, {"NUM_STAGES": 3}, True, 5),  # the pipelined loop
        ({}, {}, False, 5),  # rows (or down's slots) past the end
        ({}, {}, True, 1),  # not one whole step (steps of 2 groups)
    ],
)
def test_fp16_whole_steps_only_where_the_loads_stay_in_bounds(moe, gate_up, down, rows, groups):
    """`_whole_steps` passes WHOLE_STEPS on only for unsplit register-buffer loops over rows that
    all exist, with at least one whole step; the launchers also decline for down without AHEAD 2
    or with padded top-k slots (checked with outputs below)."""
    for base, changes in ((TINY_FP16["gate_up_config"], gate_up),
                          (TINY_FP16["down_config"], down)):  # fmt: skip
        config = base | {"WHOLE_STEPS": 2} | changes
        takes = rows and groups >= 2 and not gate_up
        assert moe._whole_steps(config, rows, groups) == (2 if takes else 0)


@pytest.mark.parametrize(
    "gate_up,down,top_k",
    [({}, {"AHEAD": 0}, 4), ({}, {"AHEAD": 2}, 3), ({"SPLIT_K": 2}, {"AHEAD": 2, "SPLIT_K": 2}, 4)],
)  # fmt: skip
def test_fp16_whole_steps_declined_still_right(moe, gate_up, down, top_k):
    """Where a GEMV cannot take WHOLE_STEPS (down without AHEAD 2, top-3 in four padded slots,
    split K) asking for it changes nothing: the same bits as without."""
    experts = _fp16_lanes(_experts(8, 160, 96, seed=63))
    x, logits = _inputs(2, 160, 8, seed=64)
    config = {
        "gate_up_config": TINY_FP16["gate_up_config"] | gate_up,
        "down_config": TINY_FP16["down_config"] | down,
    }
    out = moe.moe_mxfp4_decode_fp16(x, logits, experts, top_k, LIMIT, ALPHA, **config)
    for name in config:
        config[name] = config[name] | {"WHOLE_STEPS": 2}
    whole = moe.moe_mxfp4_decode_fp16(x, logits, experts, top_k, LIMIT, ALPHA, **config)
    assert torch.equal(whole, out)


@pytest.mark.parametrize(
    "gate_up,down,match",
    [
        ({"AHEAD": 2}, {}, "gate_up has no AHEAD"),
        ({}, {"AHEAD": 1}, "down's AHEAD is 0 or 2"),
        ({}, {"AHEAD": 0, "EARLY": 1}, "EARLY needs AHEAD 2"),
    ],
)
def test_fp16_decode_refuses_removed_ahead_options(moe, gate_up, down, match):
    """gate_up's AHEAD and down's AHEAD 1 were measured slower and removed: asking for them fails
    on the host instead of launching something else."""
    x, logits = _inputs(1, 160, 8, seed=56)
    with pytest.raises(moe.MoEShapeError, match=match):
        moe.moe_mxfp4_decode_fp16(
            x, logits, _experts(8, 160, 96, seed=54), 4, LIMIT, ALPHA,
            gate_up_config=TINY_FP16["gate_up_config"] | gate_up,
            down_config=TINY_FP16["down_config"] | down,
        )  # fmt: skip


@pytest.mark.parametrize(
    "gate_up,down",
    [((2, 4, 1), (1, 4, 1)), ((4, 8, 4), (2, 8, 4))],
)
def test_fp16_decode_few_rows_long_steps(moe, gate_up, down):
    """Tiles of 1-4 rows and steps longer than the row (8 groups of 5): the shapes the sweep
    tries for longer contiguous reads per row."""
    experts = _experts(8, 160, 96, seed=52)
    x, logits = _inputs(2, 160, 8, seed=53)
    (pairs, gu_groups, gu_warps), (rows, dn_groups, dn_warps) = gate_up, down
    config = {
        "gate_up_config": {"BLOCK_PAIRS": pairs, "GROUPS_PER_STEP": gu_groups, "SPLIT_K": 1,
                           "num_warps": gu_warps},
        "down_config": {"BLOCK_ROWS": rows, "GROUPS_PER_STEP": dn_groups, "SPLIT_K": 1,
                        "num_warps": dn_warps},
    }  # fmt: skip
    out = moe.moe_mxfp4_decode_fp16(x, logits, experts, 4, LIMIT, ALPHA, **config)
    assert _relative_error(out, _reference(x, logits, experts, 4)) < FP16_TOLERANCE


@pytest.mark.parametrize("passes", [1, 2])
def test_fp16_route_scales_x_into_range(moe, monkeypatch, passes):
    """x_h = x * 2^e per token with max |x_h| in [2^14, 2^15), as pair planes (plane p, word q:
    x[8q + p], x[8q + p + 4]); zero rows stay finite. Rows in one pass (decode) or in blocks."""
    if passes == 2:
        monkeypatch.setattr(moe, "_route_block", lambda hidden, layout: hidden // 2)
    x, logits = _inputs(3, 32, 4, seed=60)
    x[1] *= 1e-3
    x[2] = 0.0
    _, _, x_h, x_unscale = moe.route_fp16(logits, 2, x)
    rows = x_h.float() * x_unscale[:, None]
    planes = x.view(3, 4, 2, 4).permute(0, 3, 1, 2).reshape(3, 32)  # [t, p, q, h]
    torch.testing.assert_close(rows, planes, rtol=1e-3, atol=0)
    peaks = x_h[:2].float().abs().amax(dim=1)
    assert ((peaks >= 2**14) & (peaks < 2**15)).all()
    assert torch.isfinite(x_unscale).all() and (x_h[2] == 0).all()


def test_fp16_act_exponent_fits_the_clamped_swiglu(moe):
    bound = LIMIT * (LIMIT + 1)
    exp = moe.act_exponent(LIMIT)
    assert bound * 2**exp <= 65504 < bound * 2 ** (exp + 2)


def test_entry_point_without_a_finite_limit_uses_the_fp32_gemv(moe):
    experts = _experts(4, 64, 64, seed=63)
    x, logits = _inputs(1, 64, 4, seed=64)
    out = moe.moe_mxfp4(x, logits, experts, 2, float("inf"), ALPHA)
    reference = TorchOps().moe(x.float(), logits.float(), experts, 2, float("inf"), ALPHA)
    assert _relative_error(out, reference) < 1e-5


def test_fp16_decode_rejects_bad_configs(moe):
    experts = _experts(4, 64, 64, seed=61)
    x, logits = _inputs(1, 64, 4, seed=62)
    with pytest.raises(moe.MoEShapeError, match="SPLIT_K"):
        moe.moe_mxfp4_decode_fp16(
            x, logits, experts, 2, LIMIT, ALPHA, **_with_split(TINY_FP16, 0, 1)
        )
    with pytest.raises(moe.MoEShapeError, match="finite"):
        moe.moe_mxfp4_decode_fp16(x, logits, experts, 2, float("inf"), ALPHA)


@pytest.mark.parametrize("tokens,block_m", [(1, 16), (3, 16), (17, 16), (17, 64)])
def test_grouped_path_matches_reference(moe, tokens, block_m):
    """block_m 16 keeps the accumulator transposed (SWAP_AB), 64 does not."""
    experts = _experts(8, 96, 64, seed=2)
    x, logits = _inputs(tokens, 96, 8, seed=10 + tokens)
    config = TINY_GROUPED | {"block_m": block_m}
    out = moe.moe_mxfp4_grouped(x, logits, experts, 2, LIMIT, ALPHA, **config)
    assert out.shape == x.shape and out.dtype == x.dtype
    assert _relative_error(out, _reference(x, logits, experts, 2)) < 1e-5


def test_default_configs_match_reference(moe):
    """The production tile configs (partial steps everywhere at these sizes) via the entry point,
    once on each path: the decode GEMV, the grouped GEMV (when on) and the grouped kernels."""
    experts = _experts(4, 64, 64, seed=3)
    top_k = 4
    max_pairs = min(moe.DECODE_MAX_PAIRS, moe.DECODE_PAIRS_PER_EXPERT * 4)
    grouped_gemv_pairs = max(max_pairs, moe.GROUPED_GEMV_MAX_PAIRS)
    for tokens in sorted({1, max_pairs // top_k + 1, grouped_gemv_pairs // top_k + 1}):
        x, logits = _inputs(tokens, 64, 4, seed=20 + tokens)
        out = moe.moe_mxfp4(x, logits, experts, top_k, LIMIT, ALPHA)
        pairs = tokens * top_k
        fp16 = (moe.DECODE_FP16 and pairs <= max_pairs) or max_pairs < pairs <= grouped_gemv_pairs
        tolerance = FP16_TOLERANCE if fp16 else 1e-5
        assert _relative_error(out, _reference(x, logits, experts, top_k)) < tolerance


@pytest.mark.parametrize("block_m", [16, 64])
def test_grouped_bf16_lane_arithmetic(moe, monkeypatch, block_m):
    """The GPU's grouped decoding (bf16 lanes, scale 2^(s-65), accumulator * 2^64), emulated in
    fp32 on the CPU: checks the bit layout, the scale exponent and the rescale."""
    monkeypatch.setattr(moe, "EMULATE_BF16_LANES", True)
    experts = _experts(8, 96, 64, seed=2)
    x, logits = _inputs(17, 96, 8, seed=27)
    config = TINY_GROUPED | {"block_m": block_m}
    out = moe.moe_mxfp4_grouped(x, logits, experts, 2, LIMIT, ALPHA, **config)
    assert _relative_error(out, _reference(x, logits, experts, 2)) < 1e-5


# v2 tiles: REP 1 keeps them small (64 rows with 4 warps); a step is 4 (or 8) scale groups.
V2_TINY = {"REP": 1, "GROUPS_PER_STEP": 4, "NUM_STAGES": 2, "SCALE_PREFETCH": 0, "num_warps": 4}


def _v2_configs(**changes) -> dict:
    return {"gate_up_config": V2_TINY | changes, "down_config": V2_TINY | changes}


@pytest.mark.parametrize(
    "hidden,inter,tokens,changes",
    [
        (96, 64, 17, {}),  # 3 groups: only the peeled partial step; odd tokens, 2 M-tiles
        (160, 96, 5, {"SCALE_PREFETCH": 1}),  # 5 and 3 groups: a full step and a partial one
        (128, 128, 3, {}),  # 4 groups: one whole step, no partial one
        (288, 160, 9, {"GROUPS_PER_STEP": 8, "SCALE_PREFETCH": 1}),  # 9 = 8 + 1, 5 = partial
        (96, 64, 4, {"REP": 2}),  # 128-row tiles past the ends of 128 (gate_up) and 96 rows
    ],
)
def test_grouped_v2_matches_reference(moe, hidden, inter, tokens, changes):
    """v2 (bf16-lane bit layout, emulated fma on the CPU) against the fp32 reference."""
    experts = _experts(8, hidden, inter, seed=40 + hidden)
    x, logits = _inputs(tokens, hidden, 8, seed=41 + tokens)
    out = moe.moe_mxfp4_grouped_v2(x, logits, experts, 2, LIMIT, ALPHA, **_v2_configs(**changes))
    assert out.shape == x.shape and out.dtype == x.dtype
    assert _relative_error(out, _reference(x, logits, experts, 2)) < 1e-5


@pytest.mark.parametrize("block_m", [64, 128])
def test_grouped_v2_tall_tiles(moe, block_m):
    """M-tiles of 64 and 128 rows (prefill-sized; exact here, and on the GPU since they wait for
    their MMAs each step: _V2_ASYNC_MMA_MAX_M): expert 3 crowded past one tile (block_m + 7
    pairs: a full tile and a partial one), the others partial."""
    tokens = block_m + 7
    experts = _experts(8, 96, 64, seed=60 + block_m)
    x, logits = _inputs(tokens, 96, 8, seed=61 + block_m)
    logits[:, 3] += 50.0  # every token's first pick
    out = moe.moe_mxfp4_grouped_v2(
        x, logits, experts, 2, LIMIT, ALPHA, block_m=block_m, **_v2_configs(SCALE_PREFETCH=1)
    )
    assert _relative_error(out, _reference(x, logits, experts, 2)) < 1e-5


def test_v2_block_m_follows_the_cap(moe, monkeypatch):
    """Twice the mean pairs an expert, from 8 rows up to 32, and up to V2_MAX_BLOCK_M only from
    V2_TALL_MIN_PAIRS pairs an expert."""
    monkeypatch.setattr(moe, "V2_TALL_MIN_PAIRS", 64)
    assert moe._v2_block_m(256, 128) == 8  # 64 tokens of 120b: 2 pairs an expert
    assert moe._v2_block_m(4096, 128) == 32  # a 1k prompt: 32 pairs an expert
    assert moe._v2_block_m(8064, 128) == 32  # 63 pairs an expert: below the tall tiles' start
    assert moe._v2_block_m(8192, 128) == 64  # 2048 tokens: 64 pairs an expert
    assert moe._v2_block_m(32768, 128) == 64  # an 8k-token chunk
    monkeypatch.setattr(moe, "V2_MAX_BLOCK_M", 32)
    assert moe._v2_block_m(32768, 128) == 32
    monkeypatch.setattr(moe, "V2_MAX_BLOCK_M", 128)
    assert moe._v2_block_m(32768, 128) == 128
    assert moe.v2_configs(128)[0]["num_warps"] == 8


def test_v2_partials_in_bf16_only_on_prefill_tiles_of_bf16(moe, monkeypatch):
    """V2_BF16_PARTIALS: y (each pair's routed expert output, summed over slots in fp32) in bf16 on
    prefill tiles (64 rows and up) with bf16 activations; fp32 on decode tiles, for fp32 or fp16
    activations and with the switch off. The bf16 numerics run in the GPU tests (the interpreter's
    bf16 arithmetic is wrong)."""
    assert moe._v2_partials_dtype(torch.bfloat16, 64) == torch.bfloat16
    assert moe._v2_partials_dtype(torch.bfloat16, 128) == torch.bfloat16
    assert moe._v2_partials_dtype(torch.bfloat16, 16) == torch.float32
    assert moe._v2_partials_dtype(torch.float32, 64) == torch.float32
    assert moe._v2_partials_dtype(torch.float16, 64) == torch.float32
    monkeypatch.setattr(moe, "V2_BF16_PARTIALS", False)
    assert moe._v2_partials_dtype(torch.bfloat16, 64) == torch.float32


def test_grouped_v2_tiles_of_8_rows(moe):
    """BLOCK_M 8 (what v2 picks for a few rows an expert): experts 5 and 2 crowded past two
    M-tiles (17 pairs each: tiles of 8, 8 and 1), the rest spread thin."""
    experts = _experts(8, 160, 96, seed=6)
    x, logits = _inputs(23, 160, 8, seed=7)
    logits[:17, 5] += 50.0
    logits[:17, 2] += 40.0
    out = moe.moe_mxfp4_grouped_v2(
        x, logits, experts, 2, LIMIT, ALPHA, block_m=8, **_v2_configs(SCALE_PREFETCH=1)
    )
    assert _relative_error(out, _reference(x, logits, experts, 2)) < 1e-5


def test_grouped_v2_default_tile_of_8_rows(moe):
    """No configs passed at BLOCK_M 8: the kernels take v2_configs(8) (steps of 8 groups): 9
    groups of gate_up (a step and a partial one) and 5 of down (only the partial one)."""
    assert moe.v2_configs(8)[0]["GROUPS_PER_STEP"] == moe.V2_TILE_CHANGES[8]["GROUPS_PER_STEP"]
    experts = _experts(8, 288, 160, seed=8)
    x, logits = _inputs(11, 288, 8, seed=9)
    out = moe.moe_mxfp4_grouped_v2(x, logits, experts, 2, LIMIT, ALPHA, block_m=8)
    assert _relative_error(out, _reference(x, logits, experts, 2)) < 1e-5


def _routed(tokens_per_expert: dict[tuple[int, int], int], num_experts: int, seed: int):
    """Router logits sending `count` tokens to each expert pair (a, b) (a the stronger), with
    random margins so the routing weights vary."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for (a, b), count in tokens_per_expert.items():
        for _ in range(count):
            row = torch.full((num_experts,), -10.0)
            row[a], row[b] = 5.0 + torch.rand((), generator=g), 3.0 + torch.rand((), generator=g)
            rows.append(row)
    return torch.stack(rows).to(DEVICE)


@pytest.mark.parametrize("gemv_max,m_programs", [(1, 0), (2, 0), (1, 2), (2, 3)])
def test_grouped_v2_sends_small_experts_to_the_grouped_gemv(moe, monkeypatch, gemv_max,
                                                            m_programs):  # fmt: skip
    """V2_GEMV_MAX_COUNT: at 8-row tiles, experts with 1..max pairs go to the grouped fp16 GEMV
    and the rest to v2 in the same call; both write their pairs' rows of one y. Experts 0 and 1
    crowded (10 pairs: v2 tiles of 8 and 2), 2-5 with one pair, 6 with two, 7 empty. m_programs:
    a GEMV grid of 2 or 3 rows whose programs take 2-3 small experts each in turn (LOOP_M); 0: a
    row an expert."""
    from tests.kernels.interpreted import kernel_module

    monkeypatch.setattr(moe, "V2_GEMV_MAX_COUNT", gemv_max)
    monkeypatch.setattr(moe, "V2_GEMV_M_PROGRAMS", m_programs)
    gemv = kernel_module("moe_grouped_gemv")
    given = []
    down = gemv.down

    def spy(act, schedule, *args, **kwargs):
        given.append(schedule[1].tolist())
        return down(act, schedule, *args, **kwargs)

    monkeypatch.setattr(gemv, "down", spy)
    experts = _experts(8, 160, 96, seed=11)
    logits = _routed({(0, 1): 10, (2, 3): 1, (4, 5): 1, (6, 0): 1, (1, 6): 1}, 8, seed=12)
    x = _inputs(logits.shape[0], 160, 8, seed=13)[0]
    out = moe.moe_mxfp4_grouped_v2(x, logits, experts, 2, LIMIT, ALPHA, block_m=8)
    assert _relative_error(out, _reference(x, logits, experts, 2)) < FP16_TOLERANCE
    small = [0, 0, 1, 1, 1, 1, 2 if gemv_max == 2 else 0, 0]
    assert given == [small]


# Shapes for the 8-row tiles' other orders: (hidden, intermediate, tokens, config changes)
V2_8_ROW_CASES = [
    (96, 64, 17, {}),  # only the peeled partial step
    (160, 96, 5, {"SCALE_PREFETCH": 1}),  # a full step and a partial one
    (288, 160, 9, {"GROUPS_PER_STEP": 8, "SCALE_PREFETCH": 1}),  # 2 x 4 groups a step
    (160, 96, 5, {"REP": 2, "num_warps": 2}),  # two 16-row blocks a warp
]


@pytest.mark.parametrize("sync", [True, False])
@pytest.mark.parametrize("hidden,inter,tokens,changes", V2_8_ROW_CASES)
def test_grouped_v2_sync_order(moe, monkeypatch, hidden, inter, tokens, changes, sync):
    """V2_SYNC_ORDER (the default): tiles of 8 rows (mma.sync on the GPU) in their own K order,
    the activations routed and the gate_up outputs stored in it too; and, turned off, in v2's
    order."""
    monkeypatch.setattr(moe, "V2_SYNC_ORDER", sync)
    assert moe._v2_sync_order(8) == sync and not moe._v2_sync_order(16)
    experts = _experts(8, hidden, inter, seed=50 + hidden)
    x, logits = _inputs(tokens, hidden, 8, seed=51 + tokens)
    out = moe.moe_mxfp4_grouped_v2(
        x, logits, experts, 2, LIMIT, ALPHA, block_m=8, **_v2_configs(**changes)
    )
    assert _relative_error(out, _reference(x, logits, experts, 2)) < 1e-5


@pytest.mark.parametrize("block_m", [8, 16])
@pytest.mark.parametrize("hidden,inter,tokens,changes", V2_8_ROW_CASES[:3])
def test_grouped_v2_padded_scales(moe, monkeypatch, hidden, inter, tokens, changes, block_m):
    """V2_PADDED_SCALES: the scales read from a copy padded to rows of whole steps (S_ROW), in
    the loop for the pipeliner; the copy is made once and not reused for other tensors."""
    monkeypatch.setattr(moe, "V2_PADDED_SCALES", True)
    monkeypatch.setattr(moe, "_PADDED_SCALES", {})
    experts = _experts(8, hidden, inter, seed=70 + hidden)
    x, logits = _inputs(tokens, hidden, 8, seed=71 + tokens)
    run = functools.partial(moe.moe_mxfp4_grouped_v2, block_m=block_m, **_v2_configs(**changes))
    out = run(x, logits, experts, 2, LIMIT, ALPHA)
    assert _relative_error(out, _reference(x, logits, experts, 2)) < 1e-5
    step = (V2_TINY | changes)["GROUPS_PER_STEP"]
    (padded, _), _ = moe._PADDED_SCALES.values()
    assert padded.shape[-1] == -(-experts.gate_up_scales.shape[-1] // step) * step
    assert torch.equal(padded[..., : hidden // 32], experts.gate_up_scales)
    assert not padded[..., hidden // 32 :].any()
    rolled = torch.roll(experts.gate_up_scales, 1, dims=0).contiguous()
    changed = dataclasses.replace(experts, gate_up_scales=rolled)
    out = run(x, logits, changed, 2, LIMIT, ALPHA)  # other scales: another copy
    assert _relative_error(out, _reference(x, logits, changed, 2)) < 1e-5


def test_grouped_v2_padded_scales_only_for_decode_tiles(moe, monkeypatch):
    """Tiles of more rows than V2_PADDED_MAX_ROWS (prefill's) read the scales unpadded: no copy."""
    monkeypatch.setattr(moe, "V2_PADDED_SCALES", True)
    monkeypatch.setattr(moe, "_PADDED_SCALES", {})
    hidden, inter = 64, 64
    experts = _experts(8, hidden, inter, seed=72)
    x, logits = _inputs(40, hidden, 8, seed=73)
    block_m = 2 * moe.V2_PADDED_MAX_ROWS
    out = moe.moe_mxfp4_grouped_v2(x, logits, experts, 2, LIMIT, ALPHA, block_m=block_m)
    assert _relative_error(out, _reference(x, logits, experts, 2)) < 1e-5
    assert not moe._PADDED_SCALES


def test_grouped_v2_crowded_and_empty_experts(moe):
    """Every token on experts 5 and 2 (17 pairs each: two M-tiles of 16, the second with one row);
    six experts without tokens."""
    experts = _experts(8, 160, 96, seed=4)
    x, logits = _inputs(17, 160, 8, seed=5)
    logits[:, 5] += 50.0
    logits[:, 2] += 40.0
    out = moe.moe_mxfp4_grouped_v2(
        x, logits, experts, 2, LIMIT, ALPHA, block_m=16, **_v2_configs(SCALE_PREFETCH=1)
    )
    assert _relative_error(out, _reference(x, logits, experts, 2)) < 1e-5


@pytest.mark.parametrize("groups", [4, 8])
def test_v2_route_layout(moe, groups):
    """route's "v2" layout: within each step of `groups` scale groups [GH, GL], element
    32 (4 GH + GL) + 8 wi + 4h + j lands at h + 2 GL + 8 wi + 32 (j % 2) + 64 (j // 2) + 128 GH
    (the K order of the v2 weight tiles); rows are padded to whole steps."""
    hidden = 32 * groups * 2
    x, logits = _inputs(3, hidden, 4, seed=63)
    _, _, x_v2, _ = moe._route(logits, 2, x, "v2", groups)
    steps = x.view(3, 2, groups // 4, 4, 4, 2, 2, 2)  # [t, step, GH, GL, wi, h, j // 2, j % 2]
    expected = steps.permute(0, 1, 2, 6, 7, 4, 3, 5).reshape(3, hidden)
    assert torch.equal(x_v2, expected)
    _, _, padded, _ = moe._route(logits, 2, x[:, :96], "v2", groups)
    assert padded.shape == (3, 32 * groups)


# route's mma.sync layouts: element 32 (4 GH + GL) + 8 wi + 4h + j of a step, viewed as
# [GH, GL, wi // 2, wi % 2, h, j // 2, j % 2], is stored in the order of these dims (outer first)
SYNC_ROUTE_LAYOUTS = {
    # "v2_sync" (V2_SYNC_ORDER): h + 2 (wi % 2) + 4 GL + 16 (wi // 2) + 32 (j % 2) + 64 (j // 2)
    "v2_sync": (0, 5, 6, 2, 1, 3, 4),
}


@pytest.mark.parametrize("layout", sorted(SYNC_ROUTE_LAYOUTS))
@pytest.mark.parametrize("groups", [4, 8])
def test_v2_sync_route_layouts(moe, groups, layout):
    """route's layouts for v2 tiles of 8 rows in the mma.sync K order (SYNC_ROUTE_LAYOUTS)."""
    hidden = 32 * groups * 2
    x, logits = _inputs(3, hidden, 4, seed=68 + groups)
    _, _, x_v2, _ = moe._route(logits, 2, x, layout, groups)
    steps = x.view(3, 2, groups // 4, 4, 2, 2, 2, 2, 2)  # [t, step, GH, GL, ...]
    order = (0, 1) + tuple(2 + d for d in SYNC_ROUTE_LAYOUTS[layout])
    assert torch.equal(x_v2, steps.permute(order).reshape(3, hidden))


def test_grouped_v2_through_the_entry_point(moe, monkeypatch):
    """GROUPED_V2 sends batches above the GEMV limit to v2 (default configs: tiles past every
    end at these sizes); dense experts still take v1."""
    monkeypatch.setattr(moe, "GROUPED_V2", True)
    monkeypatch.setattr(moe, "GROUPED_GEMV_MAX_PAIRS", 0)  # else these pairs take the grouped GEMV
    experts = _experts(4, 64, 64, seed=64)
    tokens = min(moe.DECODE_MAX_PAIRS, moe.DECODE_PAIRS_PER_EXPERT * 4) // 4 + 1
    x, logits = _inputs(tokens, 64, 4, seed=65)
    ref = _reference(x, logits, experts, 4)
    assert _relative_error(moe.moe_mxfp4(x, logits, experts, 4, LIMIT, ALPHA), ref) < 1e-5
    dense = _dense(experts)
    assert _relative_error(moe.moe_mxfp4(x, logits, dense, 4, LIMIT, ALPHA), ref) < 1e-5
    v2_dense = moe.moe_mxfp4_grouped_v2(x, logits, dense, 4, LIMIT, ALPHA)
    assert _relative_error(v2_dense, ref) < 1e-5


def test_grouped_v2_edge_inputs(moe):
    experts = _experts(4, 64, 64, seed=66)
    x, logits = _inputs(0, 64, 4, seed=67)
    assert moe.moe_mxfp4_grouped_v2(x, logits, experts, 2, LIMIT, ALPHA).shape == (0, 64)
    x, logits = _inputs(2, 64, 4, seed=68)
    with pytest.raises(moe.MoEShapeError, match="GROUPS_PER_STEP"):
        moe.moe_mxfp4_grouped_v2(
            x, logits, experts, 2, LIMIT, ALPHA, **_v2_configs(GROUPS_PER_STEP=2)
        )


def _scaled_expert_weights(experts_scale: list[float], hidden: int, inter: int) -> ExpertWeights:
    """One expert per scale factor, weights and biases multiplied by it before quantization."""
    g = torch.Generator().manual_seed(99)
    e = len(experts_scale)
    factor = torch.tensor(experts_scale)
    gate_up = torch.randn(e, 2 * inter, hidden, generator=g) * factor[:, None, None] / hidden**0.5
    down = torch.randn(e, hidden, inter, generator=g) * factor[:, None, None] / inter**0.5
    gate_up_blocks, gate_up_scales = mxfp4.quantize(gate_up)
    down_blocks, down_scales = mxfp4.quantize(down)
    return ExpertWeights(
        gate_up_bias=(0.1 * torch.randn(e, 2 * inter, generator=g) * factor[:, None]).to(DEVICE),
        down_bias=(0.1 * torch.randn(e, hidden, generator=g) * factor[:, None]).to(DEVICE),
        gate_up_blocks=gate_up_blocks.to(DEVICE),
        gate_up_scales=gate_up_scales.to(DEVICE),
        down_blocks=down_blocks.to(DEVICE),
        down_scales=down_scales.to(DEVICE),
    )


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # numpy sigmoid(-big) = 0
@pytest.mark.parametrize("path", ["decode", "grouped", "grouped_bf16_lanes", "grouped_v2"])
def test_extreme_scales(moe, monkeypatch, path):
    """Experts whose e8m0 scales sit far from 127 (weights ~2^12, ~2^-30 and ~2^66, the last
    near the kernels' largest scale): token t routes to expert t alone, and each token's output
    must be right relative to its own size."""
    factors = [2.0**12, 2.0**-30, 1.0, 2.0**6, 2.0**66]
    n = len(factors)
    experts = _scaled_expert_weights(factors, 64, 64)
    assert experts.gate_up_scales[0].max() > 135 and experts.gate_up_scales[1].min() < 100
    assert 188 <= experts.gate_up_scales[4].max() <= mxfp4.KERNEL_MAX_SCALE
    x, _ = _inputs(n, 64, n, seed=31)
    logits = torch.full((n, n), -10.0, device=DEVICE)
    logits[torch.arange(n), torch.arange(n)] = 10.0
    ref = _reference(x, logits, experts, 1)
    if path == "decode":
        out = moe.moe_mxfp4_decode(x, logits, experts, 1, LIMIT, ALPHA)
    elif path == "grouped_v2":
        out = moe.moe_mxfp4_grouped_v2(x, logits, experts, 1, LIMIT, ALPHA, **_v2_configs())
    else:
        monkeypatch.setattr(moe, "EMULATE_BF16_LANES", path == "grouped_bf16_lanes")
        out = moe.moe_mxfp4_grouped(x, logits, experts, 1, LIMIT, ALPHA, block_m=16)
    per_token = (out.float() - ref).abs().amax(dim=1) / ref.abs().amax(dim=1)
    assert per_token.max() < 1e-5, per_token


def test_crowded_and_empty_experts(moe):
    """Every token routes to experts 5 and 2 (17 pairs each: two M-tiles of 16, the second with one
    row); the other six experts get nothing."""
    experts = _experts(8, 96, 64, seed=4)
    x, logits = _inputs(17, 96, 8, seed=5)
    logits[:, 5] += 50.0
    logits[:, 2] += 40.0
    ref = _reference(x, logits, experts, 2)
    grouped = moe.moe_mxfp4_grouped(x, logits, experts, 2, LIMIT, ALPHA, **TINY_GROUPED)
    assert _relative_error(grouped, ref) < 1e-5
    decode = moe.moe_mxfp4_decode(x[:3], logits[:3], experts, 2, LIMIT, ALPHA, **TINY_DECODE)
    assert _relative_error(decode, ref[:3]) < 1e-5


def test_float16_activations(moe):
    """fp16 in and out; the kernels compute in fp32, so only the final rounding differs."""
    experts = _experts(8, 96, 64, seed=6)
    x, logits = _inputs(3, 96, 8, seed=7)
    x, logits = x.half(), logits.half()
    ref = _reference(x, logits, experts, 3)
    for out in (
        moe.moe_mxfp4_decode(x, logits, experts, 3, LIMIT, ALPHA, **TINY_DECODE),
        moe.moe_mxfp4_grouped(x, logits, experts, 3, LIMIT, ALPHA, **TINY_GROUPED),
        moe.moe_mxfp4_grouped_v2(x, logits, experts, 3, LIMIT, ALPHA, **_v2_configs()),
    ):
        assert out.dtype == torch.float16
        torch.testing.assert_close(out, ref.half(), atol=2e-3 * ref.abs().max().item(), rtol=2e-3)


def test_dense_experts_use_the_grouped_path(moe):
    experts = _experts(4, 64, 64, seed=8)
    x, logits = _inputs(5, 64, 4, seed=9)
    dense = _dense(experts)
    ref = _reference(x, logits, dense, 2)
    assert _relative_error(moe.moe_mxfp4(x, logits, dense, 2, LIMIT, ALPHA), ref) < 1e-5
    with pytest.raises(moe.MoEShapeError, match="MXFP4"):
        moe.moe_mxfp4_decode(x, logits, dense, 2, LIMIT, ALPHA)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # numpy sigmoid(-big) = 0
def test_clamps_are_applied(moe):
    """Large activations drive gate/up past the swiglu limit; the clamps must match."""
    experts = _experts(4, 64, 64, seed=10)
    x, logits = _inputs(2, 64, 4, seed=11)
    x = 40.0 * x
    ref = _reference(x, logits, experts, 2)
    assert _relative_error(moe.moe_mxfp4_decode(x, logits, experts, 2, LIMIT, ALPHA), ref) < 1e-5
    grouped = moe.moe_mxfp4_grouped(x, logits, experts, 2, LIMIT, ALPHA, block_m=16)
    assert _relative_error(grouped, ref) < 1e-5


def test_no_tokens(moe):
    experts = _experts(4, 64, 64, seed=12)
    x, logits = _inputs(0, 64, 4, seed=13)
    assert moe.moe_mxfp4(x, logits, experts, 2, LIMIT, ALPHA).shape == (0, 64)
    assert moe.moe_mxfp4_grouped(x, logits, experts, 2, LIMIT, ALPHA).shape == (0, 64)


def test_shape_errors(moe):
    experts = _experts(4, 64, 64, seed=14)
    x, logits = _inputs(2, 64, 4, seed=15)
    with pytest.raises(moe.MoEShapeError, match="top_k"):
        moe.moe_mxfp4(x, logits, experts, 5, LIMIT, ALPHA)
    with pytest.raises(moe.MoEShapeError, match="hidden"):
        moe.moe_mxfp4(x[:, :32], logits, experts, 2, LIMIT, ALPHA)
    with pytest.raises(moe.MoEShapeError, match="experts"):
        moe.moe_mxfp4(x, logits[:, :3], experts, 2, LIMIT, ALPHA)


def test_block_m_tracks_pairs_per_expert(moe):
    assert moe._block_m(4, 128) == 16
    assert moe._block_m(4096, 128) == 32
    # capped where Triton 3.6 still compiles the tile (see _block_m)
    assert moe._block_m(65536, 128) == moe.SWAP_AB_MAX_BLOCK_M == 32


# ------------------------------------------------------------------------------------------------
# GPU: gpt-oss-120b shapes in bf16
# ------------------------------------------------------------------------------------------------

H_120B, I_120B, E_120B, TOP_K_120B = 2880, 2880, 128, 4


@pytest.fixture(scope="module")
def experts_120b() -> ExpertWeights:
    """Random packed experts with gpt-oss-120b shapes: uniform codes, scales 2^-8..2^-6 (outputs of
    order one for unit activations), bf16 biases."""
    g = torch.Generator(device="cuda").manual_seed(0)
    e, h, i = E_120B, H_120B, I_120B

    def packed(*shape):
        return torch.randint(0, 256, shape, generator=g, device="cuda", dtype=torch.uint8)

    def scales(*shape):
        return torch.randint(119, 122, shape, generator=g, device="cuda", dtype=torch.uint8)

    return ExpertWeights(
        gate_up_bias=(0.1 * torch.randn(e, 2 * i, generator=g, device="cuda")).bfloat16(),
        down_bias=(0.1 * torch.randn(e, h, generator=g, device="cuda")).bfloat16(),
        gate_up_blocks=packed(e, 2 * i, h // 32, 16),
        gate_up_scales=scales(e, 2 * i, h // 32),
        down_blocks=packed(e, h, i // 32, 16),
        down_scales=scales(e, h, i // 32),
    )


def _inputs_120b(tokens: int, seed: int):
    """bf16 activations and bf16 router logits without ties (a permutation of k/16 per token)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, H_120B, generator=g, device="cuda").bfloat16()
    order = torch.argsort(torch.rand(tokens, E_120B, generator=g, device="cuda"), dim=1)
    logits = (order.float() / 16.0).bfloat16()
    return x, logits


def _assert_close_120b(out: torch.Tensor, ref: torch.Tensor) -> None:
    """Tolerance: 1e-2 relative (norm-wise); bf16 output rounding alone is ~4e-3 per element."""
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    err = (out.float() - ref).norm() / ref.norm()
    assert err < 1e-2, f"relative error {err:.2e}"
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 4, 64, 1024])
def test_gpu_120b_matches_reference(experts_120b, tokens):
    from gossamer.kernels import moe_mxfp4

    x, logits = _inputs_120b(tokens, seed=tokens)
    out = moe_mxfp4.moe_mxfp4(x, logits, experts_120b, TOP_K_120B, LIMIT, ALPHA)
    _assert_close_120b(out, _reference(x, logits, experts_120b, TOP_K_120B))


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 8])
def test_gpu_120b_gate_up_prefetch_to_l2(experts_120b, tokens):
    """PREFETCH_L2 at 120b's shapes (2,880-byte scale blocks, 46 KB word blocks a program): the
    same bits as without it."""
    from gossamer.kernels import moe_mxfp4

    x, logits = _inputs_120b(tokens, seed=200 + tokens)
    args = (x, logits, experts_120b, TOP_K_120B, LIMIT, ALPHA)
    down = {"down_config": moe_mxfp4.DECODE_FP16_DOWN}
    out = moe_mxfp4.moe_mxfp4_decode_fp16(*args, **down)
    for prefetch in (1, 2):
        gate_up = moe_mxfp4.DECODE_FP16_GATE_UP | {"PREFETCH_L2": prefetch}
        prefetched = moe_mxfp4.moe_mxfp4_decode_fp16(*args, gate_up_config=gate_up, **down)
        assert torch.equal(prefetched, out)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 8])
def test_gpu_120b_both_paths(experts_120b, tokens):
    from gossamer.kernels import moe_mxfp4

    x, logits = _inputs_120b(tokens, seed=100 + tokens)
    ref = _reference(x, logits, experts_120b, TOP_K_120B)
    args = (x, logits, experts_120b, TOP_K_120B, LIMIT, ALPHA)
    _assert_close_120b(moe_mxfp4.moe_mxfp4_decode(*args), ref)
    _assert_close_120b(moe_mxfp4.moe_mxfp4_grouped(*args), ref)
    _assert_close_120b(moe_mxfp4.moe_mxfp4_decode_fp16(*args), ref)
    split = {
        "gate_up_config": moe_mxfp4.DECODE_FP16_GATE_UP | {"SPLIT_K": 3},
        "down_config": moe_mxfp4.DECODE_FP16_DOWN | {"SPLIT_K": 2},
    }
    _assert_close_120b(moe_mxfp4.moe_mxfp4_decode_fp16(*args, **split), ref)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [16, 64, 1024])
def test_gpu_120b_grouped_v2(experts_120b, tokens):
    """v2 (default and varied configs) against the reference, and against v1, which multiplies the
    same bf16 weights and activations (only fp32 summation order and bf16 roundings differ)."""
    from gossamer.kernels import moe_mxfp4

    x, logits = _inputs_120b(tokens, seed=400 + tokens)
    args = (x, logits, experts_120b, TOP_K_120B, LIMIT, ALPHA)
    ref = _reference(x, logits, experts_120b, TOP_K_120B)
    v2 = moe_mxfp4.moe_mxfp4_grouped_v2(*args)
    _assert_close_120b(v2, ref)
    v1 = moe_mxfp4.moe_mxfp4_grouped(*args)
    assert ((v2.float() - v1.float()).norm() / v1.float().norm()).item() < 2e-3
    variants = [
        {"SCALE_PREFETCH": 0},
        {"REP": 2, "NUM_STAGES": 2},
        {"REP": 2, "GROUPS_PER_STEP": 8},  # 90 groups: 11 steps of 8 and one of 2
    ]
    for changes in variants:
        configs = {
            "gate_up_config": moe_mxfp4.GROUPED_V2_GATE_UP | changes,
            "down_config": moe_mxfp4.GROUPED_V2_DOWN | changes,
        }
        _assert_close_120b(moe_mxfp4.moe_mxfp4_grouped_v2(*args, **configs), ref)
    # M-tiles of 8 rows: an MMA column tile of 8 (mma.sync, not wgmma, on sm_90)
    for warps in (4, 8):
        configs = {
            "gate_up_config": moe_mxfp4.GROUPED_V2_GATE_UP | {"num_warps": warps},
            "down_config": moe_mxfp4.GROUPED_V2_DOWN | {"num_warps": warps},
        }
        _assert_close_120b(moe_mxfp4.moe_mxfp4_grouped_v2(*args, block_m=8, **configs), ref)


@pytest.mark.gpu
@pytest.mark.parametrize("block_m", [64, 128])
def test_gpu_120b_grouped_v2_tall_tiles(experts_120b, monkeypatch, block_m):
    """Prefill-sized M-tiles (1k tokens: ~32 pairs an expert) on their default configs: wrong
    before each step waited for its wgmmas (session 22, H100: relative error inf / 0.82). Their
    per-pair outputs in bf16 (V2_BF16_PARTIALS) stay within bf16 rounding of fp32 ones."""
    from gossamer.kernels import moe_mxfp4

    x, logits = _inputs_120b(1024, seed=420 + block_m)
    args = (x, logits, experts_120b, TOP_K_120B, LIMIT, ALPHA)
    gate_up, down = moe_mxfp4.v2_configs(block_m)
    configs = {"gate_up_config": gate_up, "down_config": down}
    out = moe_mxfp4.moe_mxfp4_grouped_v2(*args, block_m=block_m, **configs)
    _assert_close_120b(out, _reference(x, logits, experts_120b, TOP_K_120B))
    monkeypatch.setattr(moe_mxfp4, "V2_BF16_PARTIALS", False)
    fp32_partials = moe_mxfp4.moe_mxfp4_grouped_v2(*args, block_m=block_m, **configs)
    diff = (out.float() - fp32_partials.float()).norm() / fp32_partials.float().norm()
    assert diff < 4e-3  # norm-wise; bf16 output rounding alone is ~2e-3 an element


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [16, 64])
def test_gpu_120b_grouped_v2_sync_order(experts_120b, monkeypatch, tokens):
    """V2_SYNC_ORDER (tiles of 8 rows in the mma.sync K order; the default), with 2 and 3
    pipeline stages, on the published and the repacked words (as the loader leaves them); and
    v2's order (V2_SYNC_ORDER off)."""
    from gossamer.kernels import moe_mxfp4

    x, logits = _inputs_120b(tokens, seed=410 + tokens)
    ref = _reference(x, logits, experts_120b, TOP_K_120B)
    gate_up, down = moe_mxfp4.v2_configs(8)  # the defaults' tile at 8 rows
    repacked = _fp16_lanes(experts_120b)
    for stages, sync, experts in ((2, True, experts_120b), (3, True, experts_120b),
                                  (3, True, repacked), (3, False, repacked)):  # fmt: skip
        monkeypatch.setattr(moe_mxfp4, "V2_SYNC_ORDER", sync)
        args = (x, logits, experts, TOP_K_120B, LIMIT, ALPHA)
        configs = {
            "gate_up_config": gate_up | {"NUM_STAGES": stages},
            "down_config": down | {"NUM_STAGES": stages},
        }
        _assert_close_120b(moe_mxfp4.moe_mxfp4_grouped_v2(*args, block_m=8, **configs), ref)


@pytest.mark.gpu
@pytest.mark.parametrize("gemv_max", [1, 2])
@pytest.mark.parametrize("tokens", [64, 256])
def test_gpu_120b_grouped_v2_small_experts_by_gemv(experts_120b, monkeypatch, tokens, gemv_max):
    """V2_GEMV_MAX_COUNT on the repacked words at the tiles v2 picks (8 rows at 64 tokens, 16 at
    256): the small experts through the grouped GEMV, the rest through v2, in one output; also
    replayed from a CUDA graph with new inputs (no host syncs in the split)."""
    from gossamer.kernels import moe_mxfp4

    monkeypatch.setattr(moe_mxfp4, "V2_GEMV_MAX_COUNT", gemv_max)
    x, logits = _inputs_120b(tokens, seed=440 + tokens)
    repacked = _fp16_lanes(experts_120b)
    args = (repacked, TOP_K_120B, LIMIT, ALPHA)
    _assert_close_120b(moe_mxfp4.moe_mxfp4_grouped_v2(x, logits, *args),
                       _reference(x, logits, experts_120b, TOP_K_120B))  # fmt: skip
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe_mxfp4.moe_mxfp4_grouped_v2(x, logits, *args)
    new_x, new_logits = _inputs_120b(tokens, seed=450 + tokens)
    x.copy_(new_x)
    logits.copy_(new_logits)
    graph.replay()
    _assert_close_120b(out, _reference(new_x, new_logits, experts_120b, TOP_K_120B))


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [64, 1024])
def test_gpu_120b_grouped_v2_padded_scales(experts_120b, monkeypatch, tokens):
    """V2_PADDED_SCALES (the scales as async copies from a padded copy) on the repacked words, at
    the tile v2 picks (8 rows at 64 tokens; at 1024, 32 rows, which read them unpadded), and 8
    rows with 4-group steps."""
    from gossamer.kernels import moe_mxfp4

    monkeypatch.setattr(moe_mxfp4, "V2_PADDED_SCALES", True)
    x, logits = _inputs_120b(tokens, seed=430 + tokens)
    ref = _reference(x, logits, experts_120b, TOP_K_120B)
    repacked = _fp16_lanes(experts_120b)
    args = (x, logits, repacked, TOP_K_120B, LIMIT, ALPHA)
    _assert_close_120b(moe_mxfp4.moe_mxfp4_grouped_v2(*args), ref)
    gate_up, down = (c | {"GROUPS_PER_STEP": 4} for c in moe_mxfp4.v2_configs(8))
    out = moe_mxfp4.moe_mxfp4_grouped_v2(*args, block_m=8, gate_up_config=gate_up,
                                         down_config=down)  # fmt: skip
    _assert_close_120b(out, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens,v2", [(1, False), (64, False), (64, True)])
def test_gpu_cuda_graph_replay(experts_120b, monkeypatch, tokens, v2):
    """Both paths (and grouped v2) capture in a CUDA graph (no host syncs) and replay on new
    inputs."""
    from gossamer.kernels import moe_mxfp4

    monkeypatch.setattr(moe_mxfp4, "GROUPED_V2", v2)
    x, logits = _inputs_120b(tokens, seed=200 + tokens)
    static_x, static_logits = x.clone(), logits.clone()

    def step():
        return moe_mxfp4.moe_mxfp4(static_x, static_logits, experts_120b, 4, LIMIT, ALPHA)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()
    new_x, new_logits = _inputs_120b(tokens, seed=300 + tokens)
    static_x.copy_(new_x)
    static_logits.copy_(new_logits)
    graph.replay()
    torch.cuda.synchronize()
    expected = moe_mxfp4.moe_mxfp4(new_x, new_logits, experts_120b, 4, LIMIT, ALPHA)
    assert torch.equal(static_out, expected)


@pytest.mark.gpu
def test_gpu_dense_bf16(experts_120b):
    """Dense bf16 experts (8 of them, dequantized from the packed ones) through the grouped path."""
    from gossamer.kernels import moe_mxfp4

    packed = ExpertWeights(
        gate_up_bias=experts_120b.gate_up_bias[:8],
        down_bias=experts_120b.down_bias[:8],
        gate_up_blocks=experts_120b.gate_up_blocks[:8],
        gate_up_scales=experts_120b.gate_up_scales[:8],
        down_blocks=experts_120b.down_blocks[:8],
        down_scales=experts_120b.down_scales[:8],
    )
    dense_fp32 = _dense(packed)
    dense = dataclasses.replace(
        dense_fp32,
        gate_up_dense=dense_fp32.gate_up_dense.bfloat16(),
        down_dense=dense_fp32.down_dense.bfloat16(),
    )
    del dense_fp32
    x, _ = _inputs_120b(33, seed=7)
    order = torch.argsort(torch.rand(33, 8, device="cuda"), dim=1)
    logits = (order.float() / 4.0).bfloat16()  # no ties
    out = moe_mxfp4.moe_mxfp4(x, logits, dense, 4, LIMIT, ALPHA)
    _assert_close_120b(out, _reference(x, logits, packed, 4))


# ------------------------------------------------------------------------------------------------
# The repacked GPU layouts (mxfp4.LANE_LAYOUTS)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", GPU_LAYOUTS)
def test_repack_round_trips_and_moves_bits(layout):
    blocks = torch.randint(0, 256, (3, 7, 5, 16), dtype=torch.uint8)
    repacked = mxfp4.repack(blocks, mxfp4.LAYOUT_HF, layout)
    assert not torch.equal(repacked, blocks)
    assert torch.equal(mxfp4.repack(repacked, layout, mxfp4.LAYOUT_HF), blocks)
    other = mxfp4.LAYOUT_LANES_16_8 if layout != mxfp4.LAYOUT_LANES_16_8 else GPU_LAYOUTS[0]
    assert torch.equal(mxfp4.repack(mxfp4.repack(repacked, layout, other), other, layout), repacked)
    # each element's 4 bits land where LANE_LAYOUTS says (element j + 4 sixteen bits higher)
    word = int.from_bytes(bytes(blocks[0, 0, 0, :4].tolist()), "little")
    moved = int.from_bytes(bytes(repacked[0, 0, 0, :4].tolist()), "little")
    for element in range(8):
        nibble = (word >> (4 * element)) & 0xF
        for bit, position in enumerate(mxfp4.LANE_LAYOUTS[layout][element % 4]):
            assert (moved >> ((position + 16 * (element // 4)) % 32)) & 1 == (nibble >> bit) & 1
    if layout == mxfp4.LAYOUT_FP16_LANES:  # the fp16 GEMV's hand-written masks assume these
        assert mxfp4.FP16_LANE_BITS == ((9, 15), (6, 12), (3, 14), (0, 13))


def test_unknown_layouts_raise(monkeypatch):
    blocks = torch.zeros(2, 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match="unknown MXFP4 layout 'nibbles'"):
        mxfp4.repack(blocks, mxfp4.LAYOUT_HF, "nibbles")
    monkeypatch.setenv("GOSSAMER_MXFP4_LAYOUT", "nibbles")
    with pytest.raises(ValueError, match="GOSSAMER_MXFP4_LAYOUT='nibbles'"):
        mxfp4.gpu_layout()
    monkeypatch.setenv("GOSSAMER_MXFP4_LAYOUT", mxfp4.LAYOUT_LANES_13_9)
    assert mxfp4.gpu_layout() == mxfp4.LAYOUT_LANES_13_9
    monkeypatch.delenv("GOSSAMER_MXFP4_LAYOUT")
    assert mxfp4.gpu_layout() == mxfp4.LAYOUT_FP16_LANES


@pytest.mark.parametrize("layout", GPU_LAYOUTS)
def test_reference_reads_the_repacked_layout(layout):
    experts = _experts(4, 64, 32, seed=90)
    x, logits = _inputs(3, 64, 4, seed=91)
    expected = _reference(x, logits, experts, 2)
    assert torch.equal(_reference(x, logits, _fp16_lanes(experts, layout), 2), expected)


@pytest.mark.parametrize("layout", GPU_LAYOUTS)
@pytest.mark.parametrize("tokens,split", [(1, (1, 1)), (3, (2, 1))])
def test_fp16_decode_path_reads_the_repacked_layout(moe, tokens, split, layout):
    """The packed-fp16 GEMV's unpack of each repacked layout, against the reference on the
    published layout (hidden 160 / intermediate 96: partial steps)."""
    experts = _experts(8, 160, 96, seed=92)
    x, logits = _inputs(tokens, 160, 8, seed=93 + tokens)
    config = _with_split(TINY_FP16, *split)
    repacked = _fp16_lanes(experts, layout)
    out = moe.moe_mxfp4_decode_fp16(x, logits, repacked, 4, LIMIT, ALPHA, **config)
    assert _relative_error(out, _reference(x, logits, experts, 4)) < FP16_TOLERANCE


@pytest.mark.parametrize("layout", GPU_LAYOUTS)
@pytest.mark.parametrize("hidden,inter,tokens", [(160, 96, 5), (128, 128, 17)])
def test_grouped_v2_reads_the_repacked_layout(moe, monkeypatch, hidden, inter, tokens, layout):
    experts = _experts(8, hidden, inter, seed=94)
    x, logits = _inputs(tokens, hidden, 8, seed=95)
    repacked = _fp16_lanes(experts, layout)
    out = moe.moe_mxfp4_grouped_v2(
        x, logits, repacked, 2, LIMIT, ALPHA, **_v2_configs(SCALE_PREFETCH=1)
    )
    assert _relative_error(out, _reference(x, logits, experts, 2)) < 1e-5
    monkeypatch.setattr(moe, "EMULATE_BF16_LANES", True)  # the bf16-lane arithmetic, emulated
    out = moe.moe_mxfp4_grouped_v2(x, logits, repacked, 2, LIMIT, ALPHA)
    assert _relative_error(out, _reference(x, logits, experts, 2)) < 2e-2


def test_kernels_without_the_repacked_unpack_refuse_it(moe):
    experts = _fp16_lanes(_experts(4, 64, 32, seed=96))
    x, logits = _inputs(1, 64, 4, seed=97)
    with pytest.raises(moe.MoEShapeError, match="published MXFP4 layout"):
        moe.moe_mxfp4_decode(x, logits, experts, 2, LIMIT, ALPHA, **TINY_DECODE)
    with pytest.raises(moe.MoEShapeError, match="published MXFP4 layout"):
        moe.moe_mxfp4_grouped(x, logits, experts, 2, LIMIT, ALPHA, **TINY_GROUPED)
    bad = dataclasses.replace(experts, layout="nibbles")
    with pytest.raises(moe.MoEShapeError, match="unknown MXFP4 layout"):
        moe.moe_mxfp4_decode_fp16(x, logits, bad, 2, LIMIT, ALPHA)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "tokens,layout",
    [(t, mxfp4.LAYOUT_FP16_LANES) for t in (1, 4, 64, 256)]
    + [(t, layout) for t in (1, 64, 256) for layout in GPU_LAYOUTS if layout != "fp16_lanes"],
)
def test_gpu_120b_repacked_layout(experts_120b, tokens, layout):
    """Both default paths (GEMV up to 64 pairs, grouped v2 above) on repacked 120b experts."""
    from gossamer.kernels import moe_mxfp4

    x, logits = _inputs_120b(tokens, seed=300 + tokens)
    repacked = _fp16_lanes(experts_120b, layout)
    out = moe_mxfp4.moe_mxfp4(x, logits, repacked, TOP_K_120B, LIMIT, ALPHA)
    _assert_close_120b(out, _reference(x, logits, experts_120b, TOP_K_120B))


@pytest.mark.gpu
def test_gpu_120b_fp16_down_loads_a_step_ahead(experts_120b):
    """The default GEMV configs on 120b shapes, down with AHEAD 2 and 0 and with EARLY (the first
    step's weights loaded before the PDL wait): the same bits (the same products in the same
    order, only the loads move)."""
    from gossamer.kernels import moe_mxfp4

    x, logits = _inputs_120b(2, seed=402)
    experts = _fp16_lanes(experts_120b)
    args = (x, logits, experts, TOP_K_120B, LIMIT, ALPHA)
    out, without, early = (
        moe_mxfp4.moe_mxfp4_decode_fp16(
            *args, down_config=moe_mxfp4.DECODE_FP16_DOWN | {"AHEAD": ahead, "EARLY": early}
        )
        for ahead, early in ((2, 0), (0, 0), (2, 1))
    )
    assert torch.equal(out, without) and torch.equal(out, early)
    _assert_close_120b(out, _reference(x, logits, experts_120b, TOP_K_120B))


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 8])
def test_gpu_120b_fp16_gate_up_routes_early(experts_120b, tokens):
    """gate_up's EARLY (each program's expert from the router logits and its first words, before
    the PDL wait, while the routing kernel may still run) on 120b shapes, with ties in the logits:
    the same bits as gate_up reading the routing's ids."""
    from gossamer.kernels import moe_mxfp4

    x, logits = _inputs_120b(tokens, seed=403 + tokens)
    logits[:, 7] = logits[:, 3] = logits.max() + 1  # a tie for the top slot, broken the same way
    experts = _fp16_lanes(experts_120b)
    args = (x, logits, experts, TOP_K_120B, LIMIT, ALPHA)
    outs = [
        moe_mxfp4.moe_mxfp4_decode_fp16(
            *args, gate_up_config=moe_mxfp4.DECODE_FP16_GATE_UP | {"EARLY": early}
        )
        for early in (0, 1)
    ]
    assert torch.equal(outs[0], outs[1])
    _assert_close_120b(outs[1], _reference(x, logits, experts_120b, TOP_K_120B))


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 4])
def test_gpu_120b_fp16_gate_up_scales_t(experts_120b, tokens):
    """gate_up's SCALES_T on 120b shapes: as close to the reference as without it (the group sums
    live in other threads, so the final sums may round differently)."""
    from gossamer.kernels import moe_mxfp4

    x, logits = _inputs_120b(tokens, seed=407 + tokens)
    experts = _fp16_lanes(experts_120b)
    args = (x, logits, experts, TOP_K_120B, LIMIT, ALPHA)
    ref = _reference(x, logits, experts_120b, TOP_K_120B)
    for scales_t in (0, 1):
        config = moe_mxfp4.DECODE_FP16_GATE_UP | {"SCALES_T": scales_t}
        _assert_close_120b(moe_mxfp4.moe_mxfp4_decode_fp16(*args, gate_up_config=config), ref)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 4])
def test_gpu_120b_fp16_whole_steps(experts_120b, tokens):
    """WHOLE_STEPS 1, 2 and 4 (whole steps unmasked and unrolled) in both GEMVs on 120b shapes,
    gate_up's scales through transposed pointers or not: the bits of the same configs without it
    (the same products in the same order)."""
    from gossamer.kernels import moe_mxfp4

    x, logits = _inputs_120b(tokens, seed=409 + tokens)
    experts = _fp16_lanes(experts_120b)
    args = (x, logits, experts, TOP_K_120B, LIMIT, ALPHA)
    ref = _reference(x, logits, experts_120b, TOP_K_120B)
    down = moe_mxfp4.DECODE_FP16_DOWN | {"WHOLE_STEPS": 0}
    for scales_t in (0, 1):
        gate_up = moe_mxfp4.DECODE_FP16_GATE_UP | {"SCALES_T": scales_t, "WHOLE_STEPS": 0}
        out = moe_mxfp4.moe_mxfp4_decode_fp16(*args, gate_up_config=gate_up, down_config=down)
        for unroll in (1, 2, 4):
            whole = moe_mxfp4.moe_mxfp4_decode_fp16(
                *args,
                gate_up_config=gate_up | {"WHOLE_STEPS": unroll},
                down_config=down | {"WHOLE_STEPS": unroll},
            )
            assert torch.equal(whole, out), (scales_t, unroll)
        _assert_close_120b(out, ref)


@pytest.mark.parametrize("tokens,split,stages", [(1, 1, 0), (3, 1, 0), (3, 2, 0), (2, 1, 3)])
def test_fp16_gate_up_routes_early(moe, tokens, split, stages):
    """gate_up's EARLY: each program takes its expert from the router logits (the routing's top-k,
    ties to the lower expert) instead of the routing's ids: the same outputs, bit for bit, with
    ties in the logits, split-K chunks and both loop forms; ignored where no logits are given."""
    experts = _experts(8, 160, 96, seed=56)
    x, logits = _inputs(tokens, 160, 8, seed=57 + tokens)
    logits[0, 2] = logits[0, 5] = logits[0].max() + 1  # tied for the first slot
    logits[-1, 6] = logits[-1, 1] = logits[-1].min() - 1  # tied for the last place
    config = _with_split(TINY_FP16, split, 1)
    config["gate_up_config"]["NUM_STAGES"] = stages
    out = moe.moe_mxfp4_decode_fp16(x, logits, experts, 4, LIMIT, ALPHA, **config)
    config["gate_up_config"]["EARLY"] = 1
    early = moe.moe_mxfp4_decode_fp16(x, logits, experts, 4, LIMIT, ALPHA, **config)
    assert torch.equal(early, out)
    assert _relative_error(early, _reference(x, logits, experts, 4)) < FP16_TOLERANCE
    # wrong logits would pick other experts: the outputs follow the logits, not the ids
    ids, _, x_h, x_unscale = moe.route_fp16(logits, 4, x)
    inter = experts.gate_up_bias.shape[-1] // 2
    act_exp = moe.act_exponent(LIMIT)
    gate_up = config["gate_up_config"]
    acts = [
        moe._fp16_gate_up(
            x_h, x_unscale, ids, experts, inter, 4, LIMIT, ALPHA, act_exp, gate_up, router_logits
        )  # fmt: skip
        for router_logits in (logits, None, -logits)
    ]
    assert torch.equal(acts[0], acts[1]) and not torch.equal(acts[0], acts[2])


def _spy_paths(module, monkeypatch) -> list[str]:
    """Record which path moe_mxfp4.moe_mxfp4 takes: the names of the path functions called (the
    grouped GEMV's in its own module, which the entry point imports at call time: on the CPU the
    interpreted copy, tests/kernels/interpreted.py). The GEMVs' default configs become a few
    large tiles (the interpreter pays per program and per step)."""
    calls: list[str] = []
    grouped_gemv = kernel_module("moe_grouped_gemv")
    monkeypatch.setattr(module, "DECODE_FP16_GATE_UP", TINY_FP16["gate_up_config"])
    monkeypatch.setattr(module, "DECODE_FP16_DOWN", TINY_FP16["down_config"])
    common = {"GROUPS_PER_STEP": 2, "NUM_STAGES": 0, "UNROLL": 2, "SPECIALIZE": 1, "num_warps": 1}
    monkeypatch.setattr(grouped_gemv, "GEMV_GATE_UP", {"BLOCK_PAIRS": 32} | common)
    monkeypatch.setattr(grouped_gemv, "GEMV_DOWN", {"BLOCK_ROWS": 64} | common)
    targets = [(module, "moe_mxfp4_decode_fp16", "decode"), (module, "moe_mxfp4_grouped_v2", "v2"),
               (grouped_gemv, "moe_mxfp4_grouped_gemv", "grouped_gemv")]  # fmt: skip
    for owner, name, label in targets:
        real = getattr(owner, name)

        def spy(*args, real=real, label=label, **kwargs):
            calls.append(label)
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, spy)
    return calls


def test_entry_point_sends_mid_batches_to_the_grouped_gemv(moe, monkeypatch):
    """Pairs above DECODE_MAX_PAIRS and up to GROUPED_GEMV_MAX_PAIRS go to the expert-grouped
    GEMV (moe_grouped_gemv.py, tested on its own), the rest to grouped v2; all three match the
    reference (the grouped GEMV runs interpreted on the CPU, its default configs)."""
    calls = _spy_paths(moe, monkeypatch)
    monkeypatch.setattr(moe, "DECODE_MAX_PAIRS", 4)
    monkeypatch.setattr(moe, "GROUPED_GEMV_MAX_PAIRS", 10)
    experts = _experts(8, 64, 32, seed=98)
    for tokens in (2, 5, 6):  # 4 pairs: the GEMV; 10: the grouped GEMV; 12: grouped v2
        x, logits = _inputs(tokens, 64, 8, seed=99)
        out = moe.moe_mxfp4(x, logits, experts, 2, LIMIT, ALPHA)
        assert _relative_error(out, _reference(x, logits, experts, 2)) < FP16_TOLERANCE
    assert calls == ["decode", "grouped_gemv", "v2"]


@pytest.mark.parametrize("tokens", [8, 16, 32])
def test_entry_point_default_paths_on_120b_expert_counts(moe, monkeypatch, tokens):
    """With the module's own limits, top-4 of 128 experts (gpt-oss-120b's routing, tiny hidden
    sizes): each token count takes the path the limits name and matches the reference. With the
    grouped GEMV on (GROUPED_GEMV_MAX_PAIRS 128, DECODE_MAX_PAIRS 32): the decode GEMV at 8
    tokens, the grouped GEMV at 16 and 32."""
    calls = _spy_paths(moe, monkeypatch)
    experts = _experts(128, 64, 32, seed=100)
    x, logits = _inputs(tokens, 64, 128, seed=101 + tokens)
    out = moe.moe_mxfp4(x, logits, experts, 4, LIMIT, ALPHA)
    pairs = tokens * 4
    if pairs <= min(moe.DECODE_MAX_PAIRS, moe.DECODE_PAIRS_PER_EXPERT * 128):
        assert calls == ["decode"]
    elif pairs <= moe.GROUPED_GEMV_MAX_PAIRS:
        assert calls == ["grouped_gemv"]
    else:
        assert calls == ["v2"]
    assert _relative_error(out, _reference(x, logits, experts, 4)) < FP16_TOLERANCE
