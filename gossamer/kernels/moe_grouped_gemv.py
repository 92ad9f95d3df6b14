"""Expert-grouped packed-fp16 GEMV for the MXFP4 MoE at decode batches of about 16-128 tokens.

Between the two paths of moe_mxfp4.py: the packed-fp16 GEMV (`moe_mxfp4_decode_fp16`) reads an
expert once per (token, slot) pair, which costs bytes once experts are shared (64 tokens, top-4
of 128: 256 pairs on ~111 distinct experts); the grouped tensor-core kernels (v2) read each expert
once but spend 3.2-4.2 instructions per weight on tiles of 16 rows that hold 1-2 real tokens.
This path sorts the pairs by expert (`expert_schedule`: one launch, graph-safe) and gives each
program an M-tile of up to BLOCK_M pairs of one expert (1..8) and a tile of weight rows. Each
step loads the rows' words once, unpacks every register of two fp16 lanes once, and multiplies it
with each of the M tokens' x words in one HFMA2 (`_group_dot`: fp16 accumulation within a
32-element scale group, then fp32 times the group scale, as the decode GEMV does for one token).
A tile runs the smallest of the bodies for 1, 2, 4, .. BLOCK_M token slots that holds its pairs
(`_run_tile`), since every slot costs its HFMA2s whether a pair fills it or not.

Cost model (SASS per weight and token, see GEMV_GATE_UP): about 1.2 + 0.9 / M instructions at M
slots, so at 64 tokens (~2.3 pairs per busy expert) the instructions are about those of v2 and
the bytes those of v2; the gain over v2 must come from issuing them better (simple loads, many
small programs); at 16-32 tokens it reads fewer bytes than the decode GEMV and issues fewer
instructions than v2. benchmarks/moe_grouped_gemv_sweep.py measures all three.

Layout: every tensor of the inner loop is 3-D, [rows, M, words or groups]. Weights are loaded
as [rows, 1, GROUPS_PER_STEP * 4] (16-byte runs, one scale group per thread) and x through
pointers broadcast to [rows, M, ...]: Triton orders the dims of both loads (2, 0, 1) by
contiguity and gives threads and warps to the words and rows first, so the M axis stays in
registers, a thread holds all M tokens of its (row, group), and the unpacked lanes serve them
without layout conversions (with M first, the x load spread M over threads and each step paid a
shared-memory round trip: offline sm_90 SASS, triton 3.6). A thread takes two rows that share x:
gate_up's gate and up rows, down's output rows 2i and 2i + 1.

Kernels (four launches after routing, all with PDL where available):
  0. the sort (`expert_schedule`): sorted pair indices, counts, offsets, cumulative tile counts;
  1. gate_up: grid (cdiv(INTER, BLOCK_PAIRS), M-tiles). Rows 2j (gate) and 2j+1 (up); epilogue
     * x_unscale per token, bias, clamped SwiGLU, act stored by pair index as fp16 pair planes
     scaled by 2^ACT_EXP (the decode GEMV's act format);
  2. down: grid (cdiv(H, BLOCK_ROWS), M-tiles), the same over the act planes; each pair's output
     row (+ bias) times its routing weight goes to y [P, H] fp32 by pair index;
  3. slot sum: out[t] = sum over the top_k slots of y, in x.dtype (a fixed order and no atomics
     anywhere: replays give the same bits).
The grid's M axis is an upper bound of the real tiles (no host sync); programs past the last tile
exit at once.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from gossamer.kernels import pdl
from gossamer.kernels.moe_mxfp4 import (
    MoEShapeError,
    _check,
    _e8m0_scale,
    _expert_schedule,
    _expert_tile,
    _group_dot,
    _store_act,
    _swiglu,
    act_exponent,
    layout_code,
    route_fp16,
)
from gossamer.ops.base import ExpertWeights

# Launch configurations: BLOCK_PAIRS (gate_up: intermediate pairs, i.e. 2x as many rows) /
# BLOCK_ROWS (down: output rows, taken two per thread) per program; GROUPS_PER_STEP scale groups
# (32 elements, 16 bytes per row) per step; NUM_STAGES 0 for a register double buffer of the
# words, >= 2 for tl.range pipelining through shared memory; UNROLL steps per iteration of
# the register double buffer's loop; SPECIALIZE a body per tile size (_run_tile).
# A thread takes one 16-byte run (row pair, group) per step or more: a tile with fewer runs than
# threads would share runs between threads and convert layouts through shared memory, so such
# configs are refused (_check_config).
# SASS compiled offline (sm_90, triton 3.6, benchmarks/moe_grouped_gemv_sass.py), instructions
# per weight and token in the main loops of these configs, gate_up / down, at M = 1, 2, 4 token
# slots: 2.21 / 2.20, 1.49 / 1.49, 1.12 / 1.12 (registers of one body 44, 68, 130; without
# UNROLL about 10% more instructions and fewer registers; M = 8: 0.95, ~250 registers). The
# decode GEMV takes 2.53 / 3.09 per weight and pair; the HFMA2s alone are 0.5 per weight and token.
# Rows are read in runs of 256 bytes per step (16 groups): the first version's 128-byte runs (8
# groups of 16 pair rows) measured 426 us for gate_up at 64 tokens on the H200, about half the
# copy bandwidth, and benchmarks/access_pattern.py read this weight layout at 53% of the copy
# bandwidth in 128-byte runs against 84-89% in 256-512-byte runs of 4-8 rows.
# Starting points: benchmarks/moe_grouped_gemv_sweep.py sweeps them on the H200.
GEMV_GATE_UP = {"BLOCK_PAIRS": 8, "GROUPS_PER_STEP": 16, "NUM_STAGES": 0, "UNROLL": 2,
                "SPECIALIZE": 1, "num_warps": 4}  # fmt: skip
GEMV_DOWN = {"BLOCK_ROWS": 16, "GROUPS_PER_STEP": 16, "NUM_STAGES": 0, "UNROLL": 2,
             "SPECIALIZE": 1, "num_warps": 4}  # fmt: skip
# Slot-sum kernel: output columns per program.
_SUM_BLOCK = 1024
# Token slots per M-tile (the largest body with SPECIALIZE), by pairs per call: (most pairs,
# BLOCK_M) in order, the last entry for everything above. A starting point for the sweep: tiles
# of one slot while experts rarely share a token (T * k <= E / 4), then 2, then 4 (8 would give
# every tile the registers of the 8-slot body, ~250: two programs of 4 warps per SM).
BLOCK_M_BY_PAIRS = ((32, 1), (128, 2), (1 << 62, 4))
MAX_BLOCK_M = 8
# (sorted_pairs, counts, offsets, tile_ends): the pairs in expert order (see _expert_schedule)
Schedule = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def default_block_m(num_pairs: int, num_experts: int) -> int:
    """Token slots per M-tile from BLOCK_M_BY_PAIRS (pairs scaled to 128 experts)."""
    per_128_experts = num_pairs * 128 // num_experts
    return next(block_m for most, block_m in BLOCK_M_BY_PAIRS if per_128_experts <= most)


def max_m_tiles(num_pairs: int, num_experts: int, block_m: int) -> int:
    """An upper bound of sum over experts of cdiv(count, block_m) for any routing of num_pairs
    pairs: each non-empty expert (at most min(E, P)) adds less than one tile to P / block_m."""
    busy = min(num_experts, num_pairs)
    return (num_pairs + busy * (block_m - 1)) // block_m


@triton.jit
def _tile(counts_ptr, offsets_ptr, tile_ends_ptr, E: tl.constexpr, E_P2: tl.constexpr,
          BLOCK_M: tl.constexpr):  # fmt: skip
    """_expert_tile of this program's M-tile (program_id 1): (expert, first sorted row, end of
    the expert's rows); expert E past the last tile. The grid's bound leaves many programs past
    it, and those exit on one load instead of reading and reducing all E tile ends."""
    pid_m = tl.program_id(1)
    if pid_m >= tl.load(tile_ends_ptr + E - 1):
        expert = E
        start = 0
        end = 0
    else:
        expert, start, end = _expert_tile(
            pid_m, counts_ptr, offsets_ptr, tile_ends_ptr, E, E_P2, BLOCK_M
        )
    return expert, start, end


@triton.jit
def _tile_pairs(sorted_pairs_ptr, row_start, row_end, M: tl.constexpr):
    """(pair index [M], valid [M]) of the sorted rows row_start .. row_start + M (valid below
    row_end). Invalid slots get pair 0 (in bounds; their results are never stored)."""
    sorted_row = row_start + tl.arange(0, M)
    valid = sorted_row < row_end
    return tl.load(sorted_pairs_ptr + sorted_row, mask=valid, other=0), valid


@triton.jit
def _rows_times_tokens(
    w_ptrs,  # [R, 1, GB * 4] int32 pointers: the first words of R weight rows
    s_ptrs,  # [GB, 1, R] uint8 pointers: their first scales, dims reversed (_scales)
    x_ptrs,  # [R, M, GB * 4] int32 pointers: pair plane 0 of the M tokens' x (broadcast over R)
    scale_step,
    G: tl.constexpr,  # scale groups per row
    GB: tl.constexpr,  # scale groups per step
    PLANE: tl.constexpr,  # int32 words per pair plane of x
    SECOND: tl.constexpr,  # also the rows right after these (gate_up's up rows)
    NUM_STAGES: tl.constexpr,
    UNROLL: tl.constexpr,  # steps per iteration of the register double buffer's loop
    LAYOUT: tl.constexpr,
):
    """Per-group dot products of R weight rows (and, with SECOND, of the next row of each) with M
    tokens -> (first, second) fp32 [R, M, GB], summed over the steps (second is zeros without
    SECOND). Whole steps run without masks. A last partial step reads the window of the row's
    last GB groups (in bounds: no masks on the words either) and counts only its groups from
    G_FULL on, through x's mask; only a row shorter than one step is read masked."""
    G_FULL: tl.constexpr = G // GB * GB
    SHORT: tl.constexpr = G < GB
    TAIL: tl.constexpr = (G - GB) * (G >= GB)  # the last step's first group
    first = tl.zeros([w_ptrs.shape[0], x_ptrs.shape[1], GB], tl.float32)
    second = tl.zeros([w_ptrs.shape[0], x_ptrs.shape[1], GB], tl.float32)
    if NUM_STAGES == 0:
        # Register double buffer: the words of the next step are loaded before this one is
        # computed (the step after the last whole one: the tail window, read even if unused).
        # Unrolled by 2, the buffers trade places without register moves and the loop's own
        # instructions halve: SASS per weight and token at M = 1, 2, 4 from 2.41, 1.61, 1.17 to
        # 2.16, 1.50, 1.10, for registers 40, 63, 124 -> 54, 76, 168 (gate_up, sm_90).
        next_a, next_b = _words(w_ptrs, 0, G, GB, SECOND, SHORT)
        for g0 in tl.range(0, G_FULL, GB, loop_unroll_factor=UNROLL):
            words_a = next_a
            words_b = next_b
            next_a, next_b = _words(w_ptrs, tl.minimum(g0 + GB, TAIL), G, GB, SECOND, SHORT)
            first, second = _step(first, second, words_a, words_b, s_ptrs, x_ptrs, scale_step, g0,
                                  G, G_FULL, GB, PLANE, SECOND, False, LAYOUT)  # fmt: skip
    else:  # Triton's pipeliner keeps NUM_STAGES - 1 steps of words in flight (async copies)
        for g0 in tl.range(0, G_FULL, GB, num_stages=NUM_STAGES):
            words_a, words_b = _words(w_ptrs, g0, G, GB, SECOND, SHORT)
            first, second = _step(first, second, words_a, words_b, s_ptrs, x_ptrs, scale_step, g0,
                                  G, G_FULL, GB, PLANE, SECOND, False, LAYOUT)  # fmt: skip
        next_a, next_b = _words(w_ptrs, TAIL, G, GB, SECOND, SHORT)
    if G_FULL < G:
        first, second = _step(first, second, next_a, next_b, s_ptrs, x_ptrs, scale_step, TAIL,
                              G, G_FULL, GB, PLANE, SECOND, True, LAYOUT)  # fmt: skip
    return first, second


@triton.jit
def _words(w_ptrs, g0, G: tl.constexpr, GB: tl.constexpr, SECOND: tl.constexpr,
           SHORT: tl.constexpr):  # fmt: skip
    """The words of GB groups from group g0 of the rows (and of the next rows, with SECOND).
    Rows shorter than a step (SHORT) are read masked; masked lanes stay undefined: any bits
    decode to a finite value, and they meet zero x words (as in the decode GEMV)."""
    if SHORT:
        mask = tl.arange(0, GB * 4)[None, None, :] < G * 4
        words_a = tl.load(w_ptrs, mask=mask)
        words_b = words_a
        if SECOND:
            words_b = tl.load(w_ptrs + G * 4, mask=mask)
    else:
        words_a = tl.load(w_ptrs + g0 * 4)
        words_b = words_a
        if SECOND:
            words_b = tl.load(w_ptrs + G * 4 + g0 * 4)
    return words_a, words_b


@triton.jit
def _step(first, second, words_a, words_b, s_ptrs, x_ptrs, scale_step, g0, G: tl.constexpr,
          G_FULL: tl.constexpr, GB: tl.constexpr, PLANE: tl.constexpr, SECOND: tl.constexpr,
          MASKED: tl.constexpr, LAYOUT: tl.constexpr):  # fmt: skip
    """One step of GB groups from group g0: scales, x words, packed-fp16 dot products. MASKED:
    only groups G_FULL .. G count (their x words are loaded, the others are zeros)."""
    if MASKED:
        k = g0 * 4 + tl.arange(0, GB * 4)
        x_mask = ((k >= G_FULL * 4) & (k < G * 4))[None, None, :]
        s_mask = (g0 + tl.arange(0, GB) < G)[:, None, None]
    else:  # all true: a splat constant, which the compiler drops from the loads
        x_mask = tl.full([1, 1, GB * 4], 1, tl.int1)
        s_mask = tl.full([1, 1, 1], 1, tl.int1)
    xp = x_ptrs + g0 * 4
    scales = s_ptrs + g0 * scale_step
    first = _scaled_dot(first, words_a, scales, s_mask, xp, x_mask, GB, PLANE, LAYOUT)
    if SECOND:
        second = _scaled_dot(second, words_b, scales + G, s_mask, xp, x_mask, GB, PLANE, LAYOUT)
    return first, second


@triton.jit
def _scaled_dot(acc, words, s_ptrs, s_mask, x_ptrs, x_mask, GB: tl.constexpr,
                PLANE: tl.constexpr, LAYOUT: tl.constexpr):  # fmt: skip
    """acc [R, M, GB] fp32 += the group sums of words [R, 1, GB * 4] with the M tokens' x words,
    each times its group's scale."""
    tile = tl.reshape(words, (words.shape[0], 1, GB, 4))
    scale = tl.permute(_e8m0_scale(tl.load(s_ptrs, mask=s_mask)), (2, 1, 0))  # [R, 1, GB]
    return acc + _group_dot(tile, x_ptrs, x_mask, PLANE, LAYOUT) * scale


@triton.jit
def _scales(scales_ptr, rows, scale_step, G: tl.constexpr, GB: tl.constexpr):
    """[GB, 1, R] pointers to the first GB scales of `rows` (global row indices), dims reversed.

    NOTE: with scale_step unknown at compile time no dim looks contiguous, and Triton 3.6 then
    gives the load's lanes and warps to the dims in the order written: groups first, then rows,
    as the words' load does. Permuted back to [R, 1, GB] after the load, the scales have the
    layout of the group sums they multiply (in the written order the loop converted them
    through shared memory every step: offline sm_90 SASS)."""
    return scales_ptr + tl.arange(0, GB)[:, None, None] * scale_step + rows[None, None, :] * G


@triton.jit
def _run_tile(TILE: tl.constexpr, args, CONSTS: tl.constexpr, rows, BLOCK_M: tl.constexpr,
              SPECIALIZE: tl.constexpr):  # fmt: skip
    """TILE(args, CONSTS, M) for an M-tile with `rows` pairs left in its expert, from its first.

    A tile's code runs all M token slots whether or not pairs fill them, so with SPECIALIZE the
    kernel holds a copy of TILE per size 1, 2, 4, .. BLOCK_M and each tile runs the smallest that
    covers its pairs (one branch per program, uniform across it); the registers are those of the
    largest copy. Without SPECIALIZE every tile runs BLOCK_M slots."""
    if not SPECIALIZE or BLOCK_M == 1:
        TILE(args, CONSTS, BLOCK_M)
    elif rows <= 1:
        TILE(args, CONSTS, 1)
    elif BLOCK_M == 2 or rows <= 2:
        TILE(args, CONSTS, 2)
    elif BLOCK_M == 4 or rows <= 4:
        TILE(args, CONSTS, 4)
    else:
        TILE(args, CONSTS, 8)


@triton.jit(do_not_specialize=["scale_step", "m_stride"])
def _gemv_gate_up_kernel(
    x_ptr,  # [T, H/2] int32: x * 2^e_t as fp16 pair planes (route_fp16)
    x_unscale_ptr,  # [T] fp32: 2^-e_t
    sorted_pairs_ptr,  # [P] int32: pair index (token * TOP_K + slot) in expert order
    counts_ptr,  # [E] int32 pairs per expert
    offsets_ptr,  # [E] int32 first sorted row of each expert
    tile_ends_ptr,  # [E] int32 cumulative M-tile count
    words_ptr,  # [E, 2I, H/32, 4] int32
    scales_ptr,  # [E, 2I, H/32] uint8
    bias_ptr,  # [E, 2I]
    act_ptr,  # [P, INTER] fp16 out, by pair index: act * 2^ACT_EXP as pair planes
    limit,
    alpha,
    scale_step,  # 1 at run time, not specialized (see _scales)
    H: tl.constexpr,
    INTER: tl.constexpr,
    E: tl.constexpr,
    E_P2: tl.constexpr,
    TOP_K: tl.constexpr,
    ACT_EXP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_PAIRS: tl.constexpr,
    GROUPS_PER_STEP: tl.constexpr,
    NUM_STAGES: tl.constexpr = 0,  # 0: register double buffer; >= 2: tl.range pipelining
    UNROLL: tl.constexpr = 1,  # with NUM_STAGES 0: steps per loop iteration (1 or 2)
    SPECIALIZE: tl.constexpr = True,  # a body per tile size (_run_tile)
    PDL: tl.constexpr = False,  # see gossamer/kernels/pdl.py
    LAYOUT: tl.constexpr = 0,  # moe_mxfp4.LAYOUT_HF or LAYOUT_FP16_LANES
    m_stride=0,  # > 0 (LOOP_M): the grid's M size; not specialized
    LOOP_M: tl.constexpr = False,  # a program takes M-tiles pid_m, pid_m + m_stride, ..
):
    pdl.wait(PDL)  # the schedule and x come from the kernels just before
    consts: tl.constexpr = (H, INTER, TOP_K, ACT_EXP, BLOCK_PAIRS, GROUPS_PER_STEP, NUM_STAGES,
                            UNROLL, LAYOUT)  # fmt: skip
    if LOOP_M:
        for pid_m in range(tl.program_id(1), tl.load(tile_ends_ptr + E - 1), m_stride):
            expert, start, end = _expert_tile(pid_m, counts_ptr, offsets_ptr, tile_ends_ptr, E,
                                              E_P2, BLOCK_M)  # fmt: skip
            args = (x_ptr, x_unscale_ptr, sorted_pairs_ptr, expert.to(tl.int64), start, end,
                    words_ptr, scales_ptr, bias_ptr, act_ptr, limit, alpha, scale_step)  # fmt: skip
            _run_tile(_gate_up_tile, args, consts, end - start, BLOCK_M, SPECIALIZE)
    else:
        expert, start, end = _tile(counts_ptr, offsets_ptr, tile_ends_ptr, E, E_P2, BLOCK_M)
        if expert < E:
            args = (x_ptr, x_unscale_ptr, sorted_pairs_ptr, expert.to(tl.int64), start, end,
                    words_ptr, scales_ptr, bias_ptr, act_ptr, limit, alpha, scale_step)  # fmt: skip
            _run_tile(_gate_up_tile, args, consts, end - start, BLOCK_M, SPECIALIZE)


@triton.jit
def _gate_up_tile(args, CONSTS: tl.constexpr, M: tl.constexpr):
    """gate_up for the sorted rows start .. start + M (below end) of one expert."""
    (x_ptr, x_unscale_ptr, sorted_pairs_ptr, expert, start, end, words_ptr, scales_ptr, bias_ptr,
     act_ptr, limit, alpha, scale_step) = args  # fmt: skip
    H, INTER, TOP_K, ACT_EXP, BLOCK_PAIRS, GB, NUM_STAGES, UNROLL, LAYOUT = CONSTS
    G: tl.constexpr = H // 32
    pair, valid = _tile_pairs(sorted_pairs_ptr, start, end, M)
    token = pair // TOP_K  # [M]
    j = tl.program_id(0) * BLOCK_PAIRS + tl.arange(0, BLOCK_PAIRS)  # rows 2j (gate), 2j+1 (up)
    j_ok = j < INTER
    # rows past the end are clamped (valid rows, never stored): no masks in the loop
    gate_rows = expert * (2 * INTER) + 2 * tl.minimum(j, INTER - 1)
    kw = tl.arange(0, GB * 4)  # the words of a step along one axis: 16-byte runs per row
    w_ptrs = words_ptr + gate_rows[:, None, None] * (G * 4) + kw[None, None, :]  # [BP, 1, GB*4]
    x_ptrs = x_ptr + token[None, :, None] * (H // 2) + kw[None, None, :]  # [1, M, GB * 4]
    # NOTE: broadcast to the weight tile's rows so that the load takes the words' layout (each
    # thread loads the x words of its own groups for all M tokens; see the module docstring).
    x_ptrs = tl.broadcast_to(x_ptrs, (BLOCK_PAIRS, M, GB * 4))
    s_ptrs = _scales(scales_ptr, gate_rows, scale_step, G, GB)
    acc_gate, acc_up = _rows_times_tokens(w_ptrs, s_ptrs, x_ptrs, scale_step, G, GB, H // 8,
                                          True, NUM_STAGES, UNROLL, LAYOUT)  # fmt: skip

    x_unscale = tl.load(x_unscale_ptr + token)[None, :]  # [1, M]
    bias_row = bias_ptr + expert * (2 * INTER) + 2 * j
    gate = tl.sum(acc_gate, axis=2) * x_unscale  # [BP, M]
    gate += tl.load(bias_row, mask=j_ok, other=0.0).to(tl.float32)[:, None]
    up = tl.sum(acc_up, axis=2) * x_unscale
    up += tl.load(bias_row + 1, mask=j_ok, other=0.0).to(tl.float32)[:, None]
    store_ok = j_ok[:, None] & valid[None, :]  # [BP, M]
    act = _swiglu(gate, up, limit, alpha)
    _store_act(act_ptr, pair[None, :], j[:, None], store_ok, act, INTER, ACT_EXP)


@triton.jit(do_not_specialize=["scale_step", "m_stride"])
def _gemv_down_kernel(
    act_ptr,  # [P, INTER/2] int32: act * 2^ACT_EXP as fp16 pair planes, by pair index
    sorted_pairs_ptr,  # [P] int32
    route_w_ptr,  # [P] fp32, by pair index
    counts_ptr,
    offsets_ptr,
    tile_ends_ptr,
    words_ptr,  # [E, H, INTER/32, 4] int32
    scales_ptr,  # [E, H, INTER/32] uint8
    bias_ptr,  # [E, H]
    y_ptr,  # [P, H] fp32 out, by pair index: routing weight * (expert output + bias)
    scale_step,  # 1, not specialized (see _scales)
    H: tl.constexpr,
    INTER: tl.constexpr,
    E: tl.constexpr,
    E_P2: tl.constexpr,
    ACT_EXP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    GROUPS_PER_STEP: tl.constexpr,
    NUM_STAGES: tl.constexpr = 0,
    UNROLL: tl.constexpr = 1,
    SPECIALIZE: tl.constexpr = True,
    PDL: tl.constexpr = False,
    LAYOUT: tl.constexpr = 0,
    m_stride=0,  # as in _gemv_gate_up_kernel
    LOOP_M: tl.constexpr = False,
):
    pdl.wait(PDL)  # the activations come from gate_up
    consts: tl.constexpr = (H, INTER, ACT_EXP, BLOCK_ROWS, GROUPS_PER_STEP, NUM_STAGES, UNROLL,
                            LAYOUT)  # fmt: skip
    if LOOP_M:
        for pid_m in range(tl.program_id(1), tl.load(tile_ends_ptr + E - 1), m_stride):
            expert, start, end = _expert_tile(pid_m, counts_ptr, offsets_ptr, tile_ends_ptr, E,
                                              E_P2, BLOCK_M)  # fmt: skip
            args = (act_ptr, sorted_pairs_ptr, route_w_ptr, expert.to(tl.int64), start, end,
                    words_ptr, scales_ptr, bias_ptr, y_ptr, scale_step)  # fmt: skip
            _run_tile(_down_tile, args, consts, end - start, BLOCK_M, SPECIALIZE)
    else:
        expert, start, end = _tile(counts_ptr, offsets_ptr, tile_ends_ptr, E, E_P2, BLOCK_M)
        if expert < E:
            args = (act_ptr, sorted_pairs_ptr, route_w_ptr, expert.to(tl.int64), start, end,
                    words_ptr, scales_ptr, bias_ptr, y_ptr, scale_step)  # fmt: skip
            _run_tile(_down_tile, args, consts, end - start, BLOCK_M, SPECIALIZE)


@triton.jit
def _down_tile(args, CONSTS: tl.constexpr, M: tl.constexpr):
    """down for the sorted rows start .. start + M (below end) of one expert. A thread takes
    output rows 2i and 2i + 1 (as gate_up takes a gate and an up row): one load of the x words
    serves both."""
    (act_ptr, sorted_pairs_ptr, route_w_ptr, expert, start, end, words_ptr, scales_ptr, bias_ptr,
     y_ptr, scale_step) = args  # fmt: skip
    H, INTER, ACT_EXP, BLOCK_ROWS, GB, NUM_STAGES, UNROLL, LAYOUT = CONSTS
    G: tl.constexpr = INTER // 32
    pair, valid = _tile_pairs(sorted_pairs_ptr, start, end, M)
    even = tl.program_id(0) * BLOCK_ROWS + 2 * tl.arange(0, BLOCK_ROWS // 2)  # rows 2i
    rows = expert * H + tl.minimum(even, H - 2)  # clamped, as in gate_up (H is even)
    kw = tl.arange(0, GB * 4)
    w_ptrs = words_ptr + rows[:, None, None] * (G * 4) + kw[None, None, :]  # [BN/2, 1, GB * 4]
    x_ptrs = act_ptr + pair[None, :, None] * (INTER // 2) + kw[None, None, :]  # [1, M, GB * 4]
    x_ptrs = tl.broadcast_to(x_ptrs, (BLOCK_ROWS // 2, M, GB * 4))  # as in gate_up
    s_ptrs = _scales(scales_ptr, rows, scale_step, G, GB)
    acc_even, acc_odd = _rows_times_tokens(w_ptrs, s_ptrs, x_ptrs, scale_step, G, GB,
                                           INTER // 8, True, NUM_STAGES, UNROLL,
                                           LAYOUT)  # fmt: skip
    both = tl.join(tl.sum(acc_even, axis=2), tl.sum(acc_odd, axis=2))  # [BN/2, M, 2]
    acc = tl.reshape(tl.permute(both, (0, 2, 1)), (BLOCK_ROWS, M))  # output rows in order

    row = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_ok = row < H
    bias = tl.load(bias_ptr + expert * H + row, mask=row_ok, other=0.0).to(tl.float32)
    route_w = tl.load(route_w_ptr + pair, mask=valid, other=0.0)
    y = (acc * (2.0**-ACT_EXP) + bias[:, None]) * route_w[None, :]  # [BN, M]
    tl.store(
        y_ptr + pair[None, :].to(tl.int64) * H + row[:, None],
        y,
        mask=row_ok[:, None] & valid[None, :],
    )


@triton.jit
def _slot_sum_kernel(
    y_ptr,  # [T, TOP_K, H] fp32 or bf16
    out_ptr,  # [T, H] out
    H: tl.constexpr,
    TOP_K: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """out[t] = the sum of token t's TOP_K slot rows, in out's dtype (fixed order: deterministic)."""
    token = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    col_ok = col < H
    pdl.wait(PDL)
    total = tl.zeros([BLOCK], tl.float32)
    for slot in tl.static_range(TOP_K):
        total += tl.load(y_ptr + (token * TOP_K + slot) * H + col, mask=col_ok, other=0.0)
    tl.store(out_ptr + token * H + col, total.to(out_ptr.dtype.element_ty), mask=col_ok)


@triton.jit
def _expert_counts(ids_ptr, counts_ptr, offsets_ptr, tile_ends_ptr, small_ptr, num_pairs, expert,
                   E: tl.constexpr, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr,
                   SPLIT: tl.constexpr, SMALL_BLOCK_M: tl.constexpr):  # fmt: skip
    """Pairs per expert from one-hot [CHUNK, E] tiles; stores counts, offsets (first sorted row
    of each expert) and tile_ends (cumulative BLOCK_M tiles), and returns the offsets.

    SPLIT > 0 splits the experts between two paths sharing the sorted pairs and offsets: experts
    with more than SPLIT pairs keep their counts and tiles at counts_ptr / tile_ends_ptr (zero
    for the others), those with 1..SPLIT pairs get theirs at small_ptr (counts, then the
    cumulative SMALL_BLOCK_M tiles at small_ptr + E)."""
    counts = tl.zeros(expert.shape, tl.int32)
    for start in range(0, num_pairs, CHUNK):
        pair = start + tl.arange(0, CHUNK)
        ids = tl.load(ids_ptr + pair, mask=pair < num_pairs, other=-1)
        counts += tl.sum((ids[:, None] == expert[None, :]).to(tl.int32), axis=0)
    offsets = tl.cumsum(counts, axis=0) - counts
    real = expert < E
    tl.store(offsets_ptr + expert, offsets, mask=real)
    big = counts
    if SPLIT > 0:
        big = tl.where(counts > SPLIT, counts, 0)
        small = counts - big
        tl.store(small_ptr + expert, small, mask=real)
        small_tiles = (small + SMALL_BLOCK_M - 1) // SMALL_BLOCK_M
        tl.store(small_ptr + E + expert, tl.cumsum(small_tiles, axis=0), mask=real)
    tl.store(counts_ptr + expert, big, mask=real)
    tl.store(tile_ends_ptr + expert, tl.cumsum((big + BLOCK_M - 1) // BLOCK_M, axis=0), mask=real)
    return offsets


# NOTE: num_pairs is not specialized (Triton would compile a variant for multiples of 16): one
# binary serves every batch, so the runner's warm-up needs no step per class of pair counts.
@triton.jit(do_not_specialize=["num_pairs"])
def _schedule_kernel(
    ids_ptr,  # [P] int32 expert of each (token, slot) pair
    sorted_pairs_ptr,  # [P] int32 out: pair indices, by expert, stable
    counts_ptr,  # [E] int32 out
    offsets_ptr,  # [E] int32 out: first sorted row of each expert
    tile_ends_ptr,  # [E] int32 out: cumulative M-tiles
    small_ptr,  # [2, E] int32 out with SPLIT: the small experts' counts and tile ends
    num_pairs,
    E: tl.constexpr,
    E_P2: tl.constexpr,
    BLOCK_M: tl.constexpr,
    CHUNK: tl.constexpr,
    SPLIT: tl.constexpr = 0,  # > 0: experts of 1..SPLIT pairs apart (_expert_counts)
    SMALL_BLOCK_M: tl.constexpr = 1,
    PDL: tl.constexpr = False,
):
    """_expert_schedule in one program: a counting sort over one-hot [CHUNK, E] tiles (a pair's
    sorted row is its expert's offset plus the pairs of that expert before it)."""
    expert = tl.arange(0, E_P2)
    pdl.wait(PDL)  # the ids come from routing
    # placed [E]: the next free sorted row of each expert
    placed = _expert_counts(ids_ptr, counts_ptr, offsets_ptr, tile_ends_ptr, small_ptr, num_pairs,
                            expert, E, BLOCK_M, CHUNK, SPLIT, SMALL_BLOCK_M)  # fmt: skip
    for start in range(0, num_pairs, CHUNK):
        pair = start + tl.arange(0, CHUNK)
        ids = tl.load(ids_ptr + pair, mask=pair < num_pairs, other=-1)
        onehot = (ids[:, None] == expert[None, :]).to(tl.int32)  # [CHUNK, E]
        earlier = tl.cumsum(onehot, axis=0) - onehot  # same-expert pairs before, in the chunk
        row = tl.sum(onehot * (placed[None, :] + earlier), axis=1)
        tl.store(sorted_pairs_ptr + row, pair, mask=pair < num_pairs)
        placed += tl.sum(onehot, axis=0)


@triton.jit(do_not_specialize=["num_pairs"])
def _schedule_sort_kernel(
    ids_ptr,  # as _schedule_kernel's arguments
    sorted_pairs_ptr,
    counts_ptr,
    offsets_ptr,
    tile_ends_ptr,
    small_ptr,
    num_pairs,
    E: tl.constexpr,
    E_P2: tl.constexpr,
    BLOCK_M: tl.constexpr,
    CHUNK: tl.constexpr,
    SORT_P: tl.constexpr,  # a power of two >= num_pairs
    SPLIT: tl.constexpr = 0,
    SMALL_BLOCK_M: tl.constexpr = 1,
    PDL: tl.constexpr = False,
):
    """_schedule_kernel with the placement pass replaced by one sort of (expert, pair) keys: the
    counts still come from one-hot tiles (sums only), the sorted rows from tl.sort, whose
    compare-exchange stages need no [CHUNK, E] scan."""
    pdl.wait(PDL)
    _expert_counts(ids_ptr, counts_ptr, offsets_ptr, tile_ends_ptr, small_ptr, num_pairs,
                   tl.arange(0, E_P2), E, BLOCK_M, CHUNK, SPLIT, SMALL_BLOCK_M)  # fmt: skip
    pair = tl.arange(0, SORT_P)
    ids = tl.load(ids_ptr + pair, mask=pair < num_pairs, other=E)  # padding sorts last
    keys = tl.sort(ids * SORT_P + pair)  # by expert, then by pair: the stable order
    tl.store(sorted_pairs_ptr + pair, keys % SORT_P, mask=pair < num_pairs)


# One program sorts up to this many pairs (two passes over [P, E] one-hot tiles); beyond, the
# torch ops of _expert_schedule. The grouped GEMV serves decode batches, far below it.
SCHEDULE_MAX_PAIRS = 4096
_SCHEDULE_CHUNK = 64
SCHEDULE_WARPS = 4
# Up to this many pairs, the placement pass is one tl.sort (_schedule_sort_kernel): a binary per
# power of two of pairs (`schedule_sort_size`; the runner's warm-up compiles each). Measured on an
# H100 (session 22, benchmarks/moe_schedule_sweep.py, one launch in a graph): 4 pairs 2.77 ->
# 1.55 us, 32 2.91 -> 1.68, 128 5.09 -> 2.71, 256 9.28 -> 3.92, 1024 34.4 -> 15.5; in the 120b
# batch-64 step 11.7 -> 6.3 us a layer. Beyond 1024 pairs not measured: the one-hot passes.
# GOSSAMER_SCHEDULE_SORT_MAX=0 turns it off.
SCHEDULE_SORT_MAX_PAIRS = int(os.environ.get("GOSSAMER_SCHEDULE_SORT_MAX", "1024"))


def schedule_sort_size(num_pairs: int) -> int | None:
    """The sort kernel's SORT_P for a schedule of num_pairs (None: the one-hot kernel)."""
    if 0 < num_pairs <= min(SCHEDULE_SORT_MAX_PAIRS, SCHEDULE_MAX_PAIRS):
        return max(16, triton.next_power_of_2(num_pairs))
    return None


def expert_schedule(ids: torch.Tensor, num_experts: int, block_m: int) -> Schedule:
    """moe_mxfp4._expert_schedule (the same four tensors, the same stable order) in one launch
    instead of about eight small torch kernels: (sorted_pairs, counts, offsets, tile_ends)."""
    return _schedule(ids, num_experts, block_m)[0]


def split_schedule(
    ids: torch.Tensor, num_experts: int, block_m: int, split: int, small_block_m: int
) -> tuple[Schedule, Schedule]:
    """`expert_schedule` with the experts of 1..split pairs apart, in the same launch: (the
    others' schedule in block_m tiles, the small ones' in small_block_m tiles). Both keep every
    pair's sorted row; an expert has pairs in one schedule and a count of zero in the other."""
    return _schedule(ids, num_experts, block_m, split, small_block_m)


def _schedule(
    ids: torch.Tensor, num_experts: int, block_m: int, split: int = 0, small_block_m: int = 1
) -> tuple[Schedule, Schedule | None]:
    num_pairs = ids.shape[0]
    if num_pairs > SCHEDULE_MAX_PAIRS or num_pairs == 0:
        return _split_in_torch(_expert_schedule(ids, num_experts, block_m), block_m, split,
                               small_block_m)  # fmt: skip
    sorted_pairs = torch.empty_like(ids)
    rows = torch.empty(5 if split else 3, num_experts, dtype=torch.int32, device=ids.device)
    counts, offsets, tile_ends = rows[:3]
    small_ptr = rows[3:] if split else counts  # [2, E] (unused without a split)
    args = (ids, sorted_pairs, counts, offsets, tile_ends, small_ptr, num_pairs)
    shape = {"E": num_experts, "E_P2": triton.next_power_of_2(num_experts), "BLOCK_M": block_m,
             "CHUNK": _SCHEDULE_CHUNK, "SPLIT": split, "SMALL_BLOCK_M": small_block_m,
             "num_warps": SCHEDULE_WARPS, **pdl.launch_options(ids.device)}  # fmt: skip
    sort_p = schedule_sort_size(num_pairs)
    if sort_p is not None:
        _schedule_sort_kernel[(1,)](*args, SORT_P=sort_p, **shape)
    else:
        _schedule_kernel[(1,)](*args, **shape)
    schedule = (sorted_pairs, counts, offsets, tile_ends)
    return schedule, (sorted_pairs, small_ptr[0], offsets, small_ptr[1]) if split else None


def _split_in_torch(
    schedule: Schedule, block_m: int, split: int, small_block_m: int
) -> tuple[Schedule, Schedule | None]:
    """_schedule's split from a whole schedule, in torch ops (the pair counts past one launch)."""
    if not split:
        return schedule, None
    sorted_pairs, counts, offsets, _ = schedule
    small = torch.where(counts <= split, counts, 0)

    def tile_ends(part: torch.Tensor, rows: int) -> torch.Tensor:
        return torch.cumsum((part + rows - 1) // rows, 0).to(torch.int32)

    big = counts - small
    return ((sorted_pairs, big, offsets, tile_ends(big, block_m)),
            (sorted_pairs, small, offsets, tile_ends(small, small_block_m)))  # fmt: skip


def moe_mxfp4_grouped_gemv(
    x: torch.Tensor,
    router_logits: torch.Tensor,
    experts: ExpertWeights,
    top_k: int,
    swiglu_limit: float,
    swiglu_alpha: float,
    block_m: int | None = None,
    gate_up_config: dict[str, int] | None = None,
    down_config: dict[str, int] | None = None,
) -> torch.Tensor:
    """`Ops.moe` for MXFP4 experts through the expert-grouped packed-fp16 GEMV (module docstring):
    x [T, H], router_logits [T, E] -> [T, H] in x.dtype. No host syncs, allocations sized by
    shapes only (CUDA-graph capturable). block_m (a power of two, 1..MAX_BLOCK_M) and the configs
    override default_block_m / GEMV_GATE_UP / GEMV_DOWN."""
    num_tokens, hidden, num_experts, inter = _check(x, router_logits, experts, top_k)
    if not experts.is_mxfp4:
        raise MoEShapeError("the grouped GEMV needs MXFP4 experts")
    if not 0.0 < swiglu_limit < 1e4:
        raise MoEShapeError(f"the fp16 GEMV needs a finite SwiGLU limit, got {swiglu_limit}")
    num_pairs = num_tokens * top_k
    block_m = block_m or default_block_m(num_pairs, num_experts)
    if not 1 <= block_m <= MAX_BLOCK_M or block_m & (block_m - 1):
        raise MoEShapeError(f"block_m must be a power of two in 1..{MAX_BLOCK_M}, got {block_m}")
    gu = _check_config(gate_up_config or GEMV_GATE_UP, "BLOCK_PAIRS", 1)
    dn = _check_config(down_config or GEMV_DOWN, "BLOCK_ROWS", 2)
    x = x.contiguous()
    out = torch.empty_like(x)
    if num_tokens == 0:
        return out
    ids, route_w, x_h, x_unscale = route_fp16(router_logits, top_k, x)
    schedule = expert_schedule(ids, num_experts, block_m)
    common = {"E": num_experts, "E_P2": triton.next_power_of_2(num_experts), "BLOCK_M": block_m,
              "ACT_EXP": act_exponent(swiglu_limit), "LAYOUT": layout_code(experts),
              **pdl.launch_options(x.device)}  # fmt: skip
    grid_m, loop_m = loop_grid(max_m_tiles(num_pairs, num_experts, block_m), LOOP_M_ROWS)
    act = gate_up(x_h, x_unscale, schedule, experts, top_k, swiglu_limit, swiglu_alpha, grid_m,
                  common, gu, loop_m)  # fmt: skip
    y = down(act, schedule, route_w, experts, hidden, grid_m, common, dn, loop_m=loop_m)
    slot_sum(y, out, top_k)
    return out


# The grid's M rows are an upper bound of the M-tiles (no host sync). At 32 tokens (128 pairs,
# 2-slot tiles) it is 128 rows for ~89 tiles: ~21k programs a layer that find no tile, and in
# session 35 (H100, the split of moe_mxfp4.V2_GEMV_MAX_COUNT) such programs of these kernels cost
# 0.7-1.3 ns each, up to ~25 us of a ~440 us layer here (not measured on this path). With
# LOOP_M_ROWS > 0 the grid has at most that many rows and a program takes every LOOP_M_ROWS-th
# tile in turn (LOOP_M; tiles in turn do not overlap, which cost the split's GEMV 19% where all
# 128 experts had a tile on 16 rows). 0: a row for each possible tile. Measured slower (H100,
# session 36, `moe_switch_ab.py --switch moe_grouped_gemv.LOOP_M_ROWS --values 0,32,48,64,96
# --tokens 16,32 --rounds 3`, one 120b layer): 16 tokens 265.8 us uncapped, +6.4 / +8.2% at 32 /
# 48 rows (64 and 96 leave its 64-row grid as it is); 32 tokens 449.5 us, +7.2 to +10.5% at 32-96
# rows: the empty programs cost less than the lost overlap. Off; the switch stays as the default
# path's way to run the looping body that the small-expert split (moe_mxfp4.V2_GEMV_MAX_COUNT)
# needs.
LOOP_M_ROWS = int(os.environ.get("GOSSAMER_GEMV_LOOP_M_ROWS", "0"))


def loop_grid(bound: int, rows: int) -> tuple[int, bool]:
    """(the grid's M rows, whether its programs loop over M-tiles) for `bound` possible tiles
    and at most `rows` rows (0: no cap)."""
    if 0 < rows < bound:
        return rows, True
    return bound, False


def _check_config(config: dict, rows_key: str, rows_per_thread: int) -> dict:
    """The config if every thread gets a 16-byte run of its own (see GEMV_GATE_UP)."""
    runs = config[rows_key] // rows_per_thread * config["GROUPS_PER_STEP"]
    threads = 32 * config["num_warps"]
    if runs < threads or config["GROUPS_PER_STEP"] > 32:
        raise MoEShapeError(
            f"{config}: {runs} runs of 16 bytes per step for {threads} threads (at least one "
            f"each, and at most 32 groups per step)"
        )
    return config


def gate_up(
    x_h: torch.Tensor,
    x_unscale: torch.Tensor,
    schedule: Schedule,
    experts: ExpertWeights,
    top_k: int,
    limit: float,
    alpha: float,
    grid_m: int,
    common: dict,
    config: dict,
    loop_m: bool = False,
) -> torch.Tensor:
    """The gate_up kernel -> act [P, I] fp16 by pair index (pair planes, * 2^ACT_EXP). loop_m:
    grid_m programs a row tile take every grid_m-th M-tile (grid_m below the tiles' bound)."""
    num_pairs, inter = schedule[0].shape[0], experts.gate_up_bias.shape[1] // 2
    act = torch.empty(num_pairs, inter, dtype=torch.float16, device=x_h.device)
    _gemv_gate_up_kernel[(triton.cdiv(inter, config["BLOCK_PAIRS"]), grid_m)](
        x_h.view(torch.int32), x_unscale, *schedule, experts.gate_up_blocks.view(torch.int32),
        experts.gate_up_scales, experts.gate_up_bias.contiguous(), act, float(limit),
        float(alpha), 1, H=x_h.shape[1], INTER=inter, TOP_K=top_k, **common, **config,
        m_stride=grid_m, LOOP_M=loop_m,
    )  # fmt: skip
    return act


def down(
    act: torch.Tensor,
    schedule: Schedule,
    route_w: torch.Tensor,
    experts: ExpertWeights,
    hidden: int,
    grid_m: int,
    common: dict,
    config: dict,
    y: torch.Tensor | None = None,
    loop_m: bool = False,
) -> torch.Tensor:
    """The down kernel -> y [P, H] fp32 by pair index (routing weight * (expert output + bias)):
    the rows of the schedule's pairs, in `y` if given (v2 writes the others' rows there). loop_m
    as in `gate_up`."""
    num_pairs, inter = act.shape
    if y is None:
        y = torch.empty(num_pairs, hidden, dtype=torch.float32, device=act.device)
    sorted_pairs, counts, offsets, tile_ends = schedule
    _gemv_down_kernel[(triton.cdiv(hidden, config["BLOCK_ROWS"]), grid_m)](
        act.view(torch.int32), sorted_pairs, route_w, counts, offsets, tile_ends,
        experts.down_blocks.view(torch.int32), experts.down_scales,
        experts.down_bias.contiguous(), y, 1, H=hidden, INTER=inter, **common, **config,
        m_stride=grid_m, LOOP_M=loop_m,
    )  # fmt: skip
    return y


def slot_sum(y: torch.Tensor, out: torch.Tensor, top_k: int) -> None:
    """out [T, H] = y [T * k, H] summed over each token's k slots, in out's dtype."""
    num_tokens, hidden = out.shape
    block = min(_SUM_BLOCK, triton.next_power_of_2(hidden))
    _slot_sum_kernel[(num_tokens, triton.cdiv(hidden, block))](
        y, out, H=hidden, TOP_K=top_k, BLOCK=block, num_warps=4, **pdl.launch_options(out.device)
    )
