"""The expert-grouped packed-fp16 MoE GEMV (gossamer/kernels/moe_grouped_gemv.py) against
TorchOps().moe.

CPU tests run the kernels in the Triton interpreter on tiny fp32/fp16 problems: hidden 160 (5
scale groups: whole steps and a partial one, or only a partial one when a step is longer than
the row) and intermediate 96 (3 groups), 8 experts, with the helpers of test_moe_mxfp4.py. They
cover token counts 1..40, tiles of 1..8 token slots with and without the per-size bodies, crowded
experts (several M-tiles of one expert, the last one partial), empty experts, both bit layouts,
both loop forms, row tiles past the end of the rows, fp16 activations. GPU tests (`-m gpu`) use
gpt-oss-120b shapes in bf16 and a CUDA graph.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from tests.kernels.interpreted import DEVICE, kernel_fixture
from tests.kernels.test_moe_mxfp4 import (
    ALPHA,
    FP16_TOLERANCE,
    GPU_LAYOUTS,
    LIMIT,
    _assert_close_120b,
    _dense,
    _experts,
    _fp16_lanes,
    _inputs,
    _inputs_120b,
    _reference,
    _relative_error,
    experts_120b,
)

# Its kernels call jit helpers of moe_mxfp4: without a GPU the copy imports the interpreted copy
# of moe_mxfp4 (tests/kernels/interpreted.py), the one test_moe_mxfp4.py runs.
gemv = kernel_fixture("moe_grouped_gemv")


HIDDEN, INTER, EXPERTS = 160, 96, 8


def _configs(
    pairs: int = 128,
    rows: int = 256,
    groups: int = 4,
    stages: int = 0,
    specialize: int = 1,
    unroll: int = 2,
) -> dict:
    """One program per row tile covers the rows (96 pairs, 160 rows: clamped rows past the
    ends) and steps are long, so the interpreter runs few programs and few steps (it pays for
    every jit call); 4 groups per step: 5 = 4 + a partial step, 3 = a partial step alone."""
    common = {"GROUPS_PER_STEP": groups, "NUM_STAGES": stages, "SPECIALIZE": specialize,
              "UNROLL": unroll, "num_warps": 1}  # fmt: skip
    return {
        "gate_up_config": {"BLOCK_PAIRS": pairs} | common,
        "down_config": {"BLOCK_ROWS": rows} | common,
    }


def _error(gemv, tokens: int, top_k: int, seed: int, experts=None, block_m=None, **config):
    """Relative error against the reference on the published layout (experts: the words the
    kernels read, default: random experts in the published layout)."""
    published = _experts(EXPERTS, HIDDEN, INTER, seed=70)
    x, logits = _inputs(tokens, HIDDEN, EXPERTS, seed=seed)
    out = gemv.moe_mxfp4_grouped_gemv(
        x, logits, experts or published, top_k, LIMIT, ALPHA, block_m, **(config or _configs())
    )
    assert out.shape == x.shape and out.dtype == x.dtype
    return _relative_error(out, _reference(x, logits, published, top_k))


@pytest.mark.parametrize("tokens,block_m", [(1, 1), (5, 2), (17, 4), (40, 8), (17, None)])
def test_matches_reference(gemv, tokens, block_m):
    """Token counts 1..40 (top-4 of 8 experts: up to 20 pairs per expert, so several tiles of one
    expert), per-size bodies up to block_m; None: default_block_m."""
    assert _error(gemv, tokens, 4, seed=71 + tokens, block_m=block_m) < FP16_TOLERANCE


@pytest.mark.parametrize("tokens,block_m,rows", [(17, 2, 1), (17, 2, 3), (40, 4, 5), (5, 1, 64)])
def test_grid_rows_looping_over_m_tiles(gemv, monkeypatch, tokens, block_m, rows):
    """LOOP_M_ROWS: at most `rows` grid rows, each program taking every rows-th M-tile in turn
    (one row: all of them; 17 tokens on top-4 of 8 experts in 2-slot tiles is ~36 tiles); a cap
    above the tile bound (64) leaves the grid as it was."""
    monkeypatch.setattr(gemv, "LOOP_M_ROWS", rows)
    assert gemv.loop_grid(36, rows) == ((rows, True) if rows < 36 else (36, False))
    assert _error(gemv, tokens, 4, seed=75 + rows, block_m=block_m) < FP16_TOLERANCE


@pytest.mark.parametrize("block_m,specialize", [(4, 0), (8, 0), (8, 1)])
def test_crowded_and_empty_experts(gemv, block_m, specialize):
    """Every token on experts 5 and 2 (17 pairs each: tiles of 4 or 8 and a last tile of one),
    six experts without tokens; one body of block_m slots or the per-size bodies."""
    experts = _experts(EXPERTS, HIDDEN, INTER, seed=72)
    x, logits = _inputs(17, HIDDEN, EXPERTS, seed=73)
    logits[:, 5] += 50.0
    logits[:, 2] += 40.0
    config = _configs(specialize=specialize)
    out = gemv.moe_mxfp4_grouped_gemv(x, logits, experts, 2, LIMIT, ALPHA, block_m, **config)
    assert _relative_error(out, _reference(x, logits, experts, 2)) < FP16_TOLERANCE


@pytest.mark.parametrize(
    "tokens,groups,stages,unroll,pairs,rows",
    [
        (2, 2, 0, 2, 32, 64),  # 5 groups = 2 whole steps + 1, 3 = 1 + 1; tiles that end at I
        (2, 2, 0, 1, 32, 64),  # the same, one step per loop iteration
        (3, 8, 0, 2, 64, 64),  # a step longer than the row: only the masked partial step
        (3, 4, 3, 1, 128, 256),  # tl.range pipelining: 5 = 4 + 1; 3 = the partial step alone
        (1, 1, 2, 1, 64, 128),  # pipelined whole steps only; row tiles past the ends (96, 160)
    ],
)
def test_partial_steps_and_loop_forms(gemv, tokens, groups, stages, unroll, pairs, rows):
    config = _configs(pairs=pairs, rows=rows, groups=groups, stages=stages, unroll=unroll)
    assert _error(gemv, tokens, 4, seed=74, block_m=2, **config) < FP16_TOLERANCE


@pytest.mark.parametrize("layout", GPU_LAYOUTS)
@pytest.mark.parametrize("tokens,block_m", [(3, 1), (17, 4)])
def test_reads_the_repacked_layout(gemv, tokens, block_m, layout):
    """Repacked words (the GPU layouts) against the reference on the published ones."""
    repacked = _fp16_lanes(_experts(EXPERTS, HIDDEN, INTER, seed=70), layout)
    assert _error(gemv, tokens, 4, seed=76, experts=repacked, block_m=block_m) < FP16_TOLERANCE


def test_float16_activations(gemv):
    experts = _experts(EXPERTS, HIDDEN, INTER, seed=77)
    x, logits = _inputs(6, HIDDEN, EXPERTS, seed=78)
    x, logits = x.half(), logits.half()
    out = gemv.moe_mxfp4_grouped_gemv(x, logits, experts, 3, LIMIT, ALPHA, 2, **_configs())
    ref = _reference(x, logits, experts, 3)
    assert out.dtype == torch.float16
    assert _relative_error(out, ref) < FP16_TOLERANCE


def test_no_tokens(gemv):
    experts = _experts(4, 64, 64, seed=79)
    x, logits = _inputs(0, 64, 4, seed=80)
    assert gemv.moe_mxfp4_grouped_gemv(x, logits, experts, 2, LIMIT, ALPHA).shape == (0, 64)


def test_refuses_what_it_cannot_run(gemv):
    experts = _experts(4, 64, 64, seed=81)
    x, logits = _inputs(2, 64, 4, seed=82)
    args = (x, logits, experts, 2)
    with pytest.raises(gemv.MoEShapeError, match="MXFP4"):
        gemv.moe_mxfp4_grouped_gemv(x, logits, _dense(experts), 2, LIMIT, ALPHA)
    with pytest.raises(gemv.MoEShapeError, match="finite"):
        gemv.moe_mxfp4_grouped_gemv(*args, float("inf"), ALPHA)
    with pytest.raises(gemv.MoEShapeError, match="block_m"):
        gemv.moe_mxfp4_grouped_gemv(*args, LIMIT, ALPHA, block_m=3)
    with pytest.raises(gemv.MoEShapeError, match="runs of 16 bytes"):  # 32 runs, 128 threads
        config = _configs() | {"gate_up_config": gemv.GEMV_GATE_UP | {"BLOCK_PAIRS": 4}}
        gemv.moe_mxfp4_grouped_gemv(*args, LIMIT, ALPHA, **config)


def test_tile_bound_holds_for_any_routing(gemv):
    """max_m_tiles bounds sum over experts of cdiv(count, block_m), the tiles the kernels index
    (the grid cannot depend on the routing): random and extreme count vectors."""
    rng = random.Random(0)
    for _ in range(2000):
        experts, block_m = rng.choice([8, 32, 128]), rng.choice([1, 2, 4, 8])
        pairs = rng.randint(1, 600)
        counts = [0] * experts
        spread = rng.randint(1, experts)  # how many experts the pairs may land on
        for _ in range(pairs):
            counts[rng.randrange(spread)] += 1
        tiles = sum(-(-c // block_m) for c in counts)
        assert tiles <= gemv.max_m_tiles(pairs, experts, block_m)
    # every pair on its own expert: the bound is tight
    assert gemv.max_m_tiles(100, 128, 4) == 100


@pytest.mark.parametrize(
    "pairs,experts,block_m",
    [(1, 8, 1), (63, 8, 2), (200, 6, 4), (300, 128, 4), (256, 128, 1), (130, 128, 8)],
)
@pytest.mark.parametrize("sort_max", [0, 4096], ids=["one-hot", "sort"])
def test_one_launch_schedule_matches_the_torch_ops(gemv, monkeypatch, pairs, experts, block_m,
                                                   sort_max):  # fmt: skip
    """expert_schedule (one program, one-hot tiles of 64 pairs: several chunks, a partial one;
    or the sort kernel's placement) gives exactly moe_mxfp4._expert_schedule's tensors, the
    stable order included; experts not a power of two, crowded (200 pairs on 6) and sparse (130
    on 128)."""
    from gossamer.kernels import moe_mxfp4  # the regular module: its schedule is plain torch

    monkeypatch.setattr(gemv, "SCHEDULE_SORT_MAX_PAIRS", sort_max)
    g = torch.Generator().manual_seed(pairs)
    ids = torch.randint(0, experts, (pairs,), generator=g, dtype=torch.int32).to(DEVICE)
    fused = gemv.expert_schedule(ids, experts, block_m)
    expected_all = moe_mxfp4._expert_schedule(ids, experts, block_m)
    for got, expected in zip(fused, expected_all, strict=True):
        assert got.dtype == expected.dtype and torch.equal(got, expected)


@pytest.mark.parametrize("pairs,experts,block_m,split,small_block_m",
                         [(256, 128, 8, 1, 1), (200, 6, 16, 33, 2), (40, 32, 8, 1, 1),
                          (5000, 128, 16, 39, 4)])  # fmt: skip
@pytest.mark.parametrize("sort_max", [0, 4096], ids=["one-hot", "sort"])
def test_split_schedule_gives_each_expert_to_one_path(gemv, monkeypatch, pairs, experts, block_m,
                                                      split, small_block_m, sort_max):  # fmt: skip
    """split_schedule: the whole schedule's sorted pairs and offsets in both halves; experts of
    1..split pairs counted (and tiled in small_block_m tiles) only in the small half, the others
    only in the big one; past one launch's pairs (5000) the torch ops split the same way."""
    from gossamer.kernels import moe_mxfp4

    monkeypatch.setattr(gemv, "SCHEDULE_SORT_MAX_PAIRS", sort_max)
    g = torch.Generator().manual_seed(pairs + split)
    ids = torch.randint(0, experts, (pairs,), generator=g, dtype=torch.int32).to(DEVICE)
    big, small = gemv.split_schedule(ids, experts, block_m, split, small_block_m)
    sorted_pairs, counts, offsets, _ = moe_mxfp4._expert_schedule(ids, experts, block_m)
    for half in (big, small):
        assert torch.equal(half[0], sorted_pairs) and torch.equal(half[2], offsets)
    is_small = counts <= split
    assert torch.equal(small[1], torch.where(is_small, counts, 0))
    assert torch.equal(big[1], torch.where(is_small, 0, counts))
    for (_, part, _, tile_ends), rows in ((big, block_m), (small, small_block_m)):
        assert tile_ends.dtype == torch.int32
        assert torch.equal(tile_ends, torch.cumsum((part + rows - 1) // rows, 0).to(torch.int32))
    assert 0 < int(small[1].sum()) < pairs  # these cases give both halves experts


def test_default_block_m(gemv):
    assert gemv.default_block_m(32, 128) == 1  # T = 8, top-4 of 128
    assert gemv.default_block_m(64, 128) == 2
    assert gemv.default_block_m(256, 128) == 4
    assert gemv.default_block_m(4096, 128) == 4
    assert gemv.default_block_m(64, 32) == 4  # 20b's 32 experts: as 256 pairs of 128


# ------------------------------------------------------------------------------------------------
# GPU: gpt-oss-120b shapes in bf16
# ------------------------------------------------------------------------------------------------

TOP_K_120B = 4


@pytest.fixture(scope="module")
def experts_120b_lanes():
    """test_moe_mxfp4's random 120b experts (published layout) and their repacked copy."""
    published = experts_120b.__wrapped__()  # the fixture's function
    return published, _fp16_lanes(published)


# NOTE: every (block_m, layout, config) compiles both kernels (seconds each with all the per-size
# bodies), so the GPU tests keep to a few: the loader's layout at 16-64 tokens (block_m 2 and 4)
# and the published one once.
@pytest.mark.gpu
@pytest.mark.parametrize("tokens,repacked", [(16, True), (32, True), (64, True), (32, False)])
def test_gpu_120b_matches_reference(gemv, experts_120b_lanes, tokens, repacked):
    """Default configs and block_m, both bit layouts, against the fp32 reference."""
    published, lanes = experts_120b_lanes
    experts = lanes if repacked else published
    x, logits = _inputs_120b(tokens, seed=500 + tokens)
    out = gemv.moe_mxfp4_grouped_gemv(x, logits, experts, TOP_K_120B, LIMIT, ALPHA)
    _assert_close_120b(out, _reference(x, logits, published, TOP_K_120B))


@pytest.mark.gpu
@pytest.mark.parametrize("block_m,specialize,stages", [(1, 1, 0), (4, 0, 3), (8, 1, 0)])
def test_gpu_120b_tile_sizes(gemv, experts_120b_lanes, block_m, specialize, stages):
    """One-slot tiles; one 4-slot body, pipelined; every body up to 8 slots (at 64 tokens some
    experts hold more than 4 pairs)."""
    published, lanes = experts_120b_lanes
    x, logits = _inputs_120b(64, seed=600 + block_m)
    changes = {"SPECIALIZE": specialize, "NUM_STAGES": stages}
    out = gemv.moe_mxfp4_grouped_gemv(
        x, logits, lanes, TOP_K_120B, LIMIT, ALPHA, block_m=block_m,
        gate_up_config=gemv.GEMV_GATE_UP | changes, down_config=gemv.GEMV_DOWN | changes,
    )  # fmt: skip
    _assert_close_120b(out, _reference(x, logits, published, TOP_K_120B))


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [16, 64])
def test_gpu_cuda_graph_replay(gemv, experts_120b_lanes, tokens):
    """Captured in a CUDA graph (no host syncs), replayed on new inputs: the same bits as an eager
    call (no atomics: the slot sum has a fixed order)."""
    experts = experts_120b_lanes[1]
    x, logits = _inputs_120b(tokens, seed=700 + tokens)
    static_x, static_logits = x.clone(), logits.clone()

    def step():
        return gemv.moe_mxfp4_grouped_gemv(static_x, static_logits, experts, 4, LIMIT, ALPHA)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()
    new_x, new_logits = _inputs_120b(tokens, seed=800 + tokens)
    static_x.copy_(new_x)
    static_logits.copy_(new_logits)
    graph.replay()
    torch.cuda.synchronize()
    expected = gemv.moe_mxfp4_grouped_gemv(new_x, new_logits, experts, 4, LIMIT, ALPHA)
    assert torch.equal(static_out, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [12, 24, 32])
def test_gpu_small_model_shapes_bf16(gemv, tokens):
    """The shapes of tests/kernels/test_triton_model.py's model (hidden 576, intermediate 320, top-4
    of 8 experts) in bf16 with bf16 biases, in the layout the loader repacks to: the sixth session
    saw that model's logits 12.8% off the float32 truth after a 24-token prefill with this path."""
    published = _experts(8, 576, 320, seed=800)
    published = dataclasses.replace(
        published,
        gate_up_bias=published.gate_up_bias.bfloat16(),
        down_bias=published.down_bias.bfloat16(),
    )
    x, logits = _inputs(tokens, 576, 8, seed=801 + tokens)
    x, logits = x.bfloat16(), logits.bfloat16()
    out = gemv.moe_mxfp4_grouped_gemv(x, logits, _fp16_lanes(published), 4, LIMIT, ALPHA)
    assert _relative_error(out, _reference(x, logits, published, 4)) < 1e-2
