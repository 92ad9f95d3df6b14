"""Prefill's MXFP4 MoE in Gluon: v2's grouped kernels with the dequantization overlapped with the
tensor cores (issue #8).

v2's wide tiles (`moe_mxfp4`, 64 rows) dequantize a step's weights into registers, issue the
step's wgmmas and wait for them before the next step dequantizes: `tl.dot` gives no way to keep
the registers of an in-flight wgmma's A operand untouched, so the tensor cores idle while the
weights unpack (thirty-third session: a third of the H100's bf16 peak in a prefill step). Gluon
exposes the wgmma's asynchrony: `warpgroup_mma(..., is_async=True)` returns a token and
`warpgroup_mma_wait(0, deps=[token, w])` keeps `w` alive until the wait. Each step of 128 K
positions runs in two halves of 4 wgmmas (K 0-63, 64-127):

    issue the first half's wgmmas (A: its weights in registers, B: the activations in smem)
    dequantize the second half's weights; wait
    issue the second half's wgmmas
    read step i + 1's words from shared memory, dequantize its first half; wait

so at most two halves of A operands (32 registers a thread) are alive: at 125 registers, two
programs of 8 warps share an SM (session 34, H100: one program an SM with whole steps in flight
ran 23-34% slower than v2, which keeps two; held to 128 registers ptxas serialized it, and it
tied v2). A ring of STAGES shared-memory stages, each step's activations and the next step's
words, is filled by async copies STAGES - 1 steps ahead; each thread copies the two 16-byte
word runs it reads back.

Measured (session 34, H100, `benchmarks/gluon_moe_ab.py`, one 120b layer): this loop is right
and within 1-2% of v2 (+1.9% at 2,048 tokens, +1.3% at 4,096, +1.0% at 8,192), not faster: with
two programs an SM, overlapping one program's dequantization with its own wgmmas adds nothing
to what the other program's already gives. So it stays off (`moe_mxfp4.GLUON_PREFILL`); it is
kept as the base for layouts `tl.dot` cannot express (benchmarks/NOTES.md has the next ideas).

Everything else is v2's: the same routing kernel writes x in v2's K order (4 groups a step, not
the mma.sync order), the same expert schedule, the act and output tensors in the same layouts, and
the same unpack recipes (`moe_mxfp4._v2_pair_bits`) for every word layout. A program takes 16
weight rows a warp (one wgmma M-block a warpgroup) and BLOCK_M tokens (the wgmma's N).

The weights' registers are laid out as the wgmma's A operand wants them, with no data movement:
a thread of the A layout holds rows r and r + 8 and, for K in steps of 16, the K positions
2c, 2c + 1, 2c + 8, 2c + 9 (c its lane % 4). In v2's order (position = h + 2 gl + 8 wi + 32 (j%2)
+ 64 (j//2) for code 4h + j of word wi of group gl) those are all 32 codes of group c: the four
words of one 16-byte run. `_words_layout` states that placement and `convert_layout(...,
assert_trivial=True)` fails the compile if the unpacked tile is not already the operand.

Gluon does not run under TRITON_INTERPRET: the CPU tests compile these kernels for sm_90 and check
the SASS; the GPU tests compare them with the torch reference.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from gossamer.kernels import moe_mxfp4
from gossamer.ops.base import ExpertWeights

# Triton 3.6 (the GPU image) names the async copy async_copy_global_to_shared, 3.9 async_load.
_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier  # 3.9's name, 3.6's

GROUPS_PER_STEP = 4  # v2's step (the routing kernel's x order): 128 K positions
_STEP = GROUPS_PER_STEP * moe_mxfp4.MXFP4_GROUP
STEP_K = gl.constexpr(_STEP)
WARPS = 8  # 16 weight rows a warp: two wgmma M-blocks of 64
STAGES = gl.constexpr(3)  # activation tiles in flight (async copies)


@gluon.constexpr_function
def _acc_layout(warps, block_m):
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1],
                                     instr_shape=[16, block_m, 16])  # fmt: skip


@gluon.constexpr_function
def _words_layout(warps):
    """[16 * warps rows, 4 groups, 4 words]: a thread holds rows r and r + 8 (r from its lane // 4
    and warp), group lane % 4, and that group's 4 words (one 16-byte load a row)."""
    warp_bases = [[16 << i, 0, 0] for i in range(warps.bit_length() - 1)]
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [0, 0, 2], [8, 0, 0]],
        lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
        warp_bases=warp_bases,
        block_bases=[],
        shape=[16 * warps, 4, 4],
    )


@gluon.constexpr_function
def _copy_layout(warps):
    """[tokens, 128] activations: 16-byte async copies, a warp's lanes along 2 rows of 256 bytes."""
    return gl.BlockedLayout([1, 8], [2, 16], [warps, 1], [1, 0])


@gluon.jit
def _expert_tile(pid_m, counts_ptr, offsets_ptr, tile_ends_ptr, E: gl.constexpr,
                 E_P2: gl.constexpr, BLOCK_M: gl.constexpr):  # fmt: skip
    """moe_mxfp4._expert_tile (a Triton function, whose layout-free arange Gluon does not take):
    (expert, the expert's end row, the tile's sorted rows [BLOCK_M] as the activation copies
    index them) of M-tile pid_m; expert == E past the last tile."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    e_idx = gl.arange(0, E_P2, layout=layout)
    tile_ends = gl.load(tile_ends_ptr + e_idx, mask=e_idx < E, other=2**30)
    expert = gl.sum((tile_ends <= pid_m).to(gl.int32), axis=0)
    safe = gl.minimum(expert, E - 1)
    count = gl.load(counts_ptr + safe)
    first_tile = gl.load(tile_ends_ptr + safe) - (count + BLOCK_M - 1) // BLOCK_M
    expert_start = gl.load(offsets_ptr + safe)
    row_start = expert_start + (pid_m - first_tile) * BLOCK_M
    rows_layout: gl.constexpr = gl.SliceLayout(1, _copy_layout(gl.num_warps()))
    return expert, expert_start + count, row_start + gl.arange(0, BLOCK_M, layout=rows_layout)


@gluon.jit
def _bf16_pairs(pairs, scale_pairs):
    """bf16x2 words (e2m1 * 2^-126 a lane) times bf16x2 scales -> [..., 2] bf16 (the lanes as
    consecutive elements): moe_mxfp4._scaled_bf16_pairs in Gluon."""
    return gl.inline_asm_elementwise(
        asm=moe_mxfp4._BF16_PAIR_PTX,
        constraints="=r,r,r,r,r",
        args=[gl.join(pairs, pairs), gl.join(scale_pairs, scale_pairs)],
        dtype=gl.bfloat16,
        is_pure=True,
        pack=2,
    )


@gluon.jit
def _half_values(words, scales, HALF: gl.constexpr, LAYOUT: gl.constexpr):
    """words [R, 4, 4] int32 + scales [R, 4] uint8 -> the bf16 weights * 2^-64 of codes j with
    j // 2 == HALF of each word: [R, gl, wi, h, j % 2]."""
    pairs, _ = gl.broadcast(gl.expand_dims(moe_mxfp4._bf16_scale_pairs(scales), 2), words)
    q0 = _bf16_pairs(moe_mxfp4._v2_pair_bits(words, 2 * HALF, LAYOUT), pairs)
    q1 = _bf16_pairs(moe_mxfp4._v2_pair_bits(words, 2 * HALF + 1, LAYOUT), pairs)
    return gl.join(q0, q1)


@gluon.jit
def _dequantized(words, scales, a_layout: gl.constexpr, LAYOUT: gl.constexpr):
    """words [R, 4, 4] int32 + scales [R, 4] uint8 -> [R, 128] bf16 weights * 2^-64 in v2's K
    order, as the wgmma's A operand (asserted free of data movement)."""
    low, high = _half_values(words, scales, 0, LAYOUT), _half_values(words, scales, 1, LAYOUT)
    values = gl.join(low, high)  # [R, gl, wi, h, j % 2, j // 2]
    values = gl.permute(values, (0, 5, 4, 2, 1, 3))  # [R, j // 2, j % 2, wi, gl, h]
    values = gl.reshape(values, (words.shape[0], 128))
    return gl.convert_layout(values, a_layout, assert_trivial=True)


@gluon.jit
def _dequantized_half(words, scales, HALF: gl.constexpr, a_layout: gl.constexpr,
                      LAYOUT: gl.constexpr):  # fmt: skip
    """`_dequantized`'s K positions 64 HALF .. 64 HALF + 63 of the step: [R, 64] (codes j of
    each word with j // 2 == HALF), as the A operand of the step's HALF-th 4 wgmmas."""
    values = gl.permute(_half_values(words, scales, HALF, LAYOUT), (0, 4, 2, 1, 3))
    values = gl.reshape(values, (words.shape[0], 64))  # [R, j % 2, wi, gl, h] flattened
    return gl.convert_layout(values, a_layout, assert_trivial=True)


@gluon.jit
def _load_words(w_ptr, s_ptr, rows, gl_idx, wi, step, G: gl.constexpr):
    """Step `step`'s words [R, 4, 4] and scales [R, 4] of the weight rows `rows` ([R, 1, 1]),
    masked past the last group: the last, partial step."""
    group = step * 4 + gl_idx  # [1, 4, 1]
    scale_ptrs = s_ptr + gl.sum(rows * G + group, axis=2)  # [R, 4] (the wi axis has size 1)
    words = gl.load(w_ptr + rows * (G * 4) + group * 4 + wi, mask=group < G, other=0)
    return words, gl.load(scale_ptrs, mask=gl.sum(group, axis=2) < G, other=0)


@gluon.jit
def _scales_of(s_ptr, rows, gl_idx, step, G: gl.constexpr):
    """Step `step`'s scales [R, 4] (uint8) of the weight rows `rows` ([R, 1, 1])."""
    return gl.load(s_ptr + gl.sum(rows * G + step * 4 + gl_idx, axis=2))


@gluon.jit
def _step(acc, w0, words, scales, next_scales, far_scales, x_smem, w_smem, x_ptrs, word_ptrs,
          s_ptr, rows, gl_idx, step, G: gl.constexpr, FULL: gl.constexpr,
          a_layout: gl.constexpr, LAYOUT: gl.constexpr):  # fmt: skip
    """One whole step in two halves of 4 wgmmas (K positions 0-63, 64-127): while the first
    half's wgmmas run (A: w0), the second half's weights are dequantized; while the second
    half's run, the first half of step + 1 (its words from this stage). Step + STAGES - 1's activations and step
    + STAGES's words are copied, step + 3's scales loaded. Two halves in flight at most (32
    registers a thread of A operands) leave room for two programs of 8 warps an SM.
    -> (acc, step + 1's first-half weights, its words, the scales rotated by one)."""
    async_copy.wait_group(STAGES - 2)  # this thread's copies of stage step % STAGES have landed
    _cta_barrier()  # everyone's, and every warp is past the last step's wgmma wait
    hopper.fence_async_shared()  # the copies, visible to the wgmma (the async proxy)
    ahead = step + STAGES - 1  # its stage held step - 1's tile, whose wgmmas are done
    _async_load(x_smem.index(ahead % STAGES), x_ptrs + ahead * STEP_K,
                mask=ahead < FULL)  # fmt: skip
    _async_load(w_smem.index(ahead % STAGES), word_ptrs + gl.minimum(ahead + 1, FULL - 1) * 16)
    async_copy.commit_group()
    x_tile = x_smem.index(step % STAGES)
    token = hopper.warpgroup_mma(w0, x_tile.slice(0, 64, dim=1).permute((1, 0)), acc,
                                 is_async=True)  # fmt: skip
    w1 = _dequantized_half(words, scales, 1, a_layout, LAYOUT)
    # w1 passes through the wait so that LLVM computes it before the wait. The deps are an
    # LLVM-level use only (ptxas sees a comment) and ptxas may still sink work below the wait;
    # the offline SASS (gluon_moe_sass.py) shows where it went.
    acc, _, w1 = hopper.warpgroup_mma_wait(0, deps=[token, w0, w1])
    token = hopper.warpgroup_mma(w1, x_tile.slice(64, 64, dim=1).permute((1, 0)), acc,
                                 is_async=True)  # fmt: skip
    farther_scales = _scales_of(s_ptr, rows, gl_idx, gl.minimum(step + 3, FULL - 1), G)
    next_words = w_smem.index(step % STAGES).load(_words_layout(gl.num_warps()))
    next_w0 = _dequantized_half(next_words, next_scales, 0, a_layout, LAYOUT)
    acc, _, next_w0 = hopper.warpgroup_mma_wait(0, deps=[token, w1, next_w0])
    return acc, next_w0, next_words, next_scales, far_scales, farther_scales


@gluon.jit
def _matmul(x_rows, w_ptr, s_ptr, rows, K: gl.constexpr, BLOCK_M: gl.constexpr,
            LAYOUT: gl.constexpr):  # fmt: skip
    """-> fp32 [R, BLOCK_M] (the wgmma accumulator layout, * 2^64 applied): the weight rows
    `rows` ([R, 1, 1] in `_words_layout`) times the activations whose rows start at x_rows
    ([BLOCK_M, 1] pointers in `_copy_layout`, v2's K order, padded to whole steps).

    Stage k of the shared-memory ring holds step k's activations and step k + 1's words (each
    thread copies the 2 x 16 bytes it will read back: no bank conflicts, no layout change)."""
    NW: gl.constexpr = gl.num_warps()
    acc_layout: gl.constexpr = _acc_layout(NW, BLOCK_M)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    words_layout: gl.constexpr = _words_layout(NW)
    copy_layout: gl.constexpr = _copy_layout(NW)
    x_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16)
    w_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])
    G: gl.constexpr = K // 32
    FULL: gl.constexpr = G // 4  # whole steps; a last partial one runs after the loop
    gl_idx = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, words_layout)))
    gl_idx = gl.expand_dims(gl.expand_dims(gl_idx, 0), 2)
    wi = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, words_layout)))
    wi = gl.expand_dims(gl.expand_dims(wi, 0), 1)
    word_ptrs = w_ptr + rows * (G * 4) + gl_idx * 4 + wi  # [R, 4, 4]: step 0's words
    col = gl.expand_dims(gl.arange(0, STEP_K, layout=gl.SliceLayout(0, copy_layout)), 0)
    x_ptrs = x_rows + col  # [BLOCK_M, 128]: step 0's activations
    x_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, STEP_K], x_layout)
    w_smem = gl.allocate_shared_memory(gl.int32, [STAGES, rows.shape[0], 4, 4], w_layout)
    acc = gl.zeros([rows.shape[0], BLOCK_M], gl.float32, layout=acc_layout)

    for s in gl.static_range(STAGES - 1):  # the first stages in flight
        if s < FULL:
            _async_load(x_smem.index(s), x_ptrs + s * STEP_K)
            _async_load(w_smem.index(s), word_ptrs + min(s + 1, FULL - 1) * 16)
        async_copy.commit_group()
    words = gl.load(word_ptrs)
    scales = _scales_of(s_ptr, rows, gl_idx, 0, G)
    w0 = _dequantized_half(words, scales, 0, a_layout, LAYOUT)
    next_scales = _scales_of(s_ptr, rows, gl_idx, 1 % FULL, G)
    far_scales = _scales_of(s_ptr, rows, gl_idx, 2 % FULL, G)
    for step in range(FULL):
        acc, w0, words, scales, next_scales, far_scales = _step(
            acc, w0, words, scales, next_scales, far_scales, x_smem, w_smem, x_ptrs, word_ptrs,
            s_ptr, rows, gl_idx, step, G, FULL, a_layout, LAYOUT)  # fmt: skip
    async_copy.wait_group(0)
    if G % 4 != 0:  # the last partial step: masked words and activations
        words, scales = _load_words(w_ptr, s_ptr, rows, gl_idx, wi, FULL, G)
        w = _dequantized(words, scales, a_layout, LAYOUT)
        group = FULL * 4 + moe_mxfp4._v2_group_of(col, False)
        x = gl.load(x_ptrs + FULL * STEP_K, mask=group < G, other=0.0)
        _cta_barrier()  # every warp is past its last wgmma wait: stage 0 is free
        x_smem.index(0).store(x)
        hopper.fence_async_shared()  # the stores, visible to the wgmma
        _cta_barrier()
        acc = hopper.warpgroup_mma(w, x_smem.index(0).permute((1, 0)), acc)
    return acc * moe_mxfp4._LANE_RESCALE


@gluon.jit
def _tile_rows():
    """A program's weight rows 0 .. R - 1 as [R, 1, 1] in `_words_layout` (R = 16 warps): row
    16 w + 8 d + r is warp w's d-th half, as in the wgmma accumulator."""
    NW: gl.constexpr = gl.num_warps()
    R: gl.constexpr = 16 * NW
    words_layout: gl.constexpr = _words_layout(NW)
    rows3 = gl.arange(0, R, layout=gl.SliceLayout(1, gl.SliceLayout(2, words_layout)))
    rows3 = gl.expand_dims(gl.expand_dims(rows3, 1), 2)
    return rows3


@gluon.jit
def gate_up_kernel(
    x_ptr,  # [T, X_WIDTH] activations in v2's order (4 groups a step)
    sorted_pairs_ptr,  # [P] int32: pair index (token * TOP_K + slot) in expert order
    counts_ptr,  # [E] int32 pairs per expert
    offsets_ptr,  # [E] int32 first sorted row of each expert
    tile_ends_ptr,  # [E] int32 cumulative M-tile count
    w_ptr,  # [E, 2I, H/32, 4] int32 (packed rows as words)
    scales_ptr,  # [E, 2I, H/32] uint8
    bias_ptr,  # [E, 2I]
    act_ptr,  # [P, ACT_WIDTH] out: sorted rows, in v2's order of the down kernel's steps
    limit,
    alpha,
    H: gl.constexpr,
    INTER: gl.constexpr,
    E: gl.constexpr,
    E_P2: gl.constexpr,
    TOP_K: gl.constexpr,
    BLOCK_M: gl.constexpr,
    X_WIDTH: gl.constexpr,
    ACT_WIDTH: gl.constexpr,
    LAYOUT: gl.constexpr,
):
    NW: gl.constexpr = gl.num_warps()
    BP: gl.constexpr = 8 * NW  # intermediate pairs a program: rows 2j (gate), 2j + 1 (up)
    pid_n = gl.program_id(0)
    expert, row_end, sorted_row = _expert_tile(gl.program_id(1), counts_ptr, offsets_ptr,
                                               tile_ends_ptr, E, E_P2, BLOCK_M)  # fmt: skip
    if expert < E:
        e64 = expert.to(gl.int64)
        # rows past the expert's end read token 0's activations; their results are never stored
        pair = gl.load(sorted_pairs_ptr + sorted_row, mask=sorted_row < row_end, other=0)
        x_rows = x_ptr + gl.expand_dims((pair // TOP_K).to(gl.int64) * X_WIDTH, 1)
        t = _tile_rows()  # 16 w + 8 d + r: pair 8 w + r, gate (d = 0) or up (d = 1)
        pair_index = gl.minimum(pid_n * BP + 8 * (t // 16) + t % 8, INTER - 1)  # clamped: unstored
        rows = e64 * (2 * INTER) + 2 * pair_index + (t // 8) % 2
        acc = _matmul(x_rows, w_ptr, scales_ptr, rows, H, BLOCK_M, LAYOUT)

        acc = gl.permute(gl.reshape(acc, (NW, 2, 8, BLOCK_M)), (0, 2, 3, 1))
        gate, up = gl.split(acc)  # [NW, 8, M]
        gate = gl.reshape(gate, (BP, BLOCK_M))
        up = gl.reshape(up, (BP, BLOCK_M))
        j = pid_n * BP + gl.arange(0, BP, layout=gl.SliceLayout(1, gate.type.layout))
        j_ok = j < INTER
        bias_row = bias_ptr + e64 * (2 * INTER) + 2 * j
        gate += gl.expand_dims(gl.load(bias_row, mask=j_ok).to(gl.float32), 1)
        up += gl.expand_dims(gl.load(bias_row + 1, mask=j_ok).to(gl.float32), 1)
        act = moe_mxfp4._swiglu(gate, up, limit, alpha)  # [BP, M]
        position = moe_mxfp4._v2_position(j, 4)
        out_row = gl.convert_layout(sorted_row, gl.SliceLayout(0, gate.type.layout))
        out_ptrs = act_ptr + gl.expand_dims(out_row.to(gl.int64) * ACT_WIDTH, 0)
        gl.store(
            out_ptrs + gl.expand_dims(position, 1),
            act.to(act_ptr.dtype.element_ty),
            mask=gl.expand_dims(out_row < row_end, 0) & gl.expand_dims(j_ok, 1),
        )


@gluon.jit
def down_kernel(
    act_ptr,  # [P, X_WIDTH] sorted rows, in v2's order (4 groups a step)
    sorted_pairs_ptr,  # [P] int32
    route_w_ptr,  # [P] fp32, by pair index
    counts_ptr,
    offsets_ptr,
    tile_ends_ptr,
    w_ptr,  # [E, H, INTER/32, 4] int32
    scales_ptr,  # [E, H, INTER/32] uint8
    bias_ptr,  # [E, H]
    y_ptr,  # [P, H] fp32 out, by pair index: routing weight * expert output
    H: gl.constexpr,
    INTER: gl.constexpr,
    E: gl.constexpr,
    E_P2: gl.constexpr,
    BLOCK_M: gl.constexpr,
    X_WIDTH: gl.constexpr,
    LAYOUT: gl.constexpr,
):
    NW: gl.constexpr = gl.num_warps()
    R: gl.constexpr = 16 * NW  # output columns a program
    pid_n = gl.program_id(0)
    expert, row_end, sorted_row = _expert_tile(gl.program_id(1), counts_ptr, offsets_ptr,
                                               tile_ends_ptr, E, E_P2, BLOCK_M)  # fmt: skip
    if expert < E:
        e64 = expert.to(gl.int64)
        # rows past the expert's end re-read its last row (in bounds); never stored
        act_row = gl.minimum(sorted_row, row_end - 1)
        x_rows = act_ptr + gl.expand_dims(act_row.to(gl.int64) * X_WIDTH, 1)
        rows = e64 * H + gl.minimum(pid_n * R + _tile_rows(), H - 1)
        acc = _matmul(x_rows, w_ptr, scales_ptr, rows, INTER, BLOCK_M, LAYOUT)

        acc_layout: gl.constexpr = _acc_layout(NW, BLOCK_M)
        col = pid_n * R + gl.arange(0, R, layout=gl.SliceLayout(1, acc_layout))
        col_ok = col < H
        out_row = gl.convert_layout(sorted_row, gl.SliceLayout(0, acc_layout))
        sorted_ok = out_row < row_end
        pair = gl.load(sorted_pairs_ptr + out_row, mask=sorted_ok, other=0)
        bias = gl.load(bias_ptr + e64 * H + col, mask=col_ok, other=0.0).to(gl.float32)
        route_w = gl.load(route_w_ptr + pair, mask=sorted_ok, other=0.0)
        gl.store(
            y_ptr + gl.expand_dims(pair.to(gl.int64) * H, 0) + gl.expand_dims(col, 1),
            (acc + gl.expand_dims(bias, 1)) * gl.expand_dims(route_w, 0),
            mask=gl.expand_dims(sorted_ok, 0) & gl.expand_dims(col_ok, 1),
        )


def supported(device: torch.device) -> bool:
    """Whether these kernels can run on `device`: Hopper (wgmma) under a compiling Triton."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


MIN_K = 2 * _STEP  # the loop's prologue takes two whole steps


def takes(experts: ExpertWeights, dtype: torch.dtype, hidden: int, inter: int) -> bool:
    """Whether these kernels take the problem (else v2 does)."""
    return experts.is_mxfp4 and dtype == torch.bfloat16 and min(hidden, inter) >= MIN_K


def moe_mxfp4_gluon(
    x: torch.Tensor,
    router_logits: torch.Tensor,
    experts: ExpertWeights,
    top_k: int,
    swiglu_limit: float,
    swiglu_alpha: float,
    block_m: int = 64,
    num_warps: int = WARPS,
    maxnreg: int | None = None,
) -> torch.Tensor:
    """`moe_mxfp4.moe_mxfp4_grouped_v2` through the Gluon kernels: x [T, H] bf16, router_logits
    [T, E] -> [T, H]; MXFP4 experts in any word layout; M-tiles of block_m (64 or 128) tokens,
    16 weight rows a warp (num_warps 4 or 8), maxnreg registers a thread if given."""
    num_tokens, hidden, num_experts, inter = moe_mxfp4._check(x, router_logits, experts, top_k)
    if not takes(experts, x.dtype, hidden, inter) or block_m not in (64, 128):
        raise moe_mxfp4.MoEShapeError(
            f"the Gluon MoE takes MXFP4 experts, bf16 x, hidden and intermediate sizes of at least "
            f"{MIN_K} and 64- or 128-token tiles, got {x.dtype}, {hidden}, {inter}, {block_m}"
        )
    x = x.contiguous()
    if num_tokens == 0:
        return torch.empty_like(x)
    num_pairs = num_tokens * top_k
    ids, route_w, x_v2, _ = moe_mxfp4._route(router_logits, top_k, x, "v2", GROUPS_PER_STEP)
    from gossamer.kernels.moe_grouped_gemv import expert_schedule, slot_sum

    schedule = expert_schedule(ids, num_experts, block_m)
    max_m_tiles = triton.cdiv(num_pairs, block_m) + min(num_experts, num_pairs)
    act_width = moe_mxfp4._v2_padded(inter, GROUPS_PER_STEP)
    act = torch.empty(num_pairs, act_width, dtype=torch.bfloat16, device=x.device)
    common = {"E": num_experts, "E_P2": triton.next_power_of_2(num_experts), "BLOCK_M": block_m,
              "LAYOUT": moe_mxfp4.layout_code(experts), "num_warps": num_warps}  # fmt: skip
    if maxnreg:
        common["maxnreg"] = maxnreg
    gate_up_kernel[(triton.cdiv(inter, 8 * num_warps), max_m_tiles)](
        x_v2, *schedule, experts.gate_up_blocks.view(torch.int32), experts.gate_up_scales,
        experts.gate_up_bias.contiguous(), act, float(swiglu_limit), float(swiglu_alpha),
        H=hidden, INTER=inter, TOP_K=top_k, X_WIDTH=x_v2.shape[1], ACT_WIDTH=act_width, **common,
    )  # fmt: skip
    y = torch.empty(num_pairs, hidden, dtype=torch.float32, device=x.device)  # by pair index
    sorted_pairs, counts, offsets, tile_ends = schedule
    down_kernel[(triton.cdiv(hidden, 16 * num_warps), max_m_tiles)](
        act, sorted_pairs, route_w, counts, offsets, tile_ends,
        experts.down_blocks.view(torch.int32), experts.down_scales, experts.down_bias.contiguous(),
        y, H=hidden, INTER=inter, X_WIDTH=act_width, **common,
    )  # fmt: skip
    out = torch.empty_like(x)
    slot_sum(y, out, top_k)
    return out
