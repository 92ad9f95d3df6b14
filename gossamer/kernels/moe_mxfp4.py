"""Triton MoE for GPT-OSS's MXFP4 experts: routing, a batch-1 GEMV path and a grouped-GEMM path.

`moe_mxfp4` has the signature of `Ops.moe` and matches `TorchOps().moe` (fp32 accumulation).

Routing (one kernel, one program per token): top-k of the router logits (ties go to the lower
expert id), softmax over the chosen k in fp32. Writes expert ids [T*k] int32 and weights [T*k] fp32.

Decode path (few (token, slot) pairs; see `moe_mxfp4` for the limit), three launches, no host
syncs (two where the GEMVs route themselves: `moe_from_logits`, ROUTE_IN_EXPERTS). Two GEMV variants share this structure: the packed-fp16 one (the default, DECODE_FP16; its
section below says how it differs) and the fp32 one described here:
  1. routing, which also writes x in fp32 in the "nibble-plane" order the GEMV reads (below);
  2. gate_up GEMV: one program per (block of intermediate pairs, (token, slot)); it streams the
     packed rows 2j (gate) and 2j+1 (up) of its expert, dequantizes in registers, accumulates in
     fp32, adds the bias and applies the clamped SwiGLU, writing the activation [T*k, I] (fp32, in
     nibble-plane order);
  3. down GEMV: one program per (block of output rows, token); it streams the rows of all k experts
     of its token at once, adds each bias, weighs by the routing weight and sums, writing [T, H].
  Each chosen expert's bytes are read once per (token, slot) and no atomics are needed.

Grouped path (larger batches, and dense weights): the T*k (token, slot) pairs are sorted by expert
with graph-safe torch ops; a program takes a tile of BLOCK_M rows of one expert (a tile-to-expert map
is found in-kernel from the cumulative tile counts) and a tile of output columns, dequantizes the
weight tile in registers and feeds tl.dot (fp32 accumulate). gate_up fuses bias and SwiGLU; down
writes each pair's output scaled by its routing weight, then a sum over the k slots gives [T, H].
The grid is sized by an upper bound of tiles and programs without work exit at once. With at most
32 rows per tile the accumulator is kept transposed (SWAP_AB: weights are the M >= 64 operand).
GROUPED_V2 switches MXFP4 experts to a second version of these kernels whose weight tiles come out
of the loads already in the tensor cores' register layout (its section says how).

MXFP4 decoding. A packed row is read as int32 words (8 e2m1 codes per word; code i of a word is
element 8w+i of the row, the low nibble of a byte being the even element). Codes i and i+4 sit 16
bits apart, so two shifts and masks turn them into a 2-lane word:
  * GEMV: fp16 lanes (magnitude bits to 9..11, sign to 15) hold exactly e2m1 * 2^-14 (the e2m1
    subnormal 0.5 lands on an fp16 subnormal, which fp16 -> fp32 conversion keeps); the 2^14 is
    folded into the group scale 2^(s-127). The GEMV wants x in the matching "nibble planes" order
    x_planes[t, i, q] = x[t, 8q + i], so each code of a word meets a contiguous vector of x.
  * grouped (inline PTX): bf16 lanes (magnitude to 6..8, sign to 15) hold e2m1 * 2^-126, and one
    packed bf16 fma by 2^(s-65) gives weight * 2^-64 exactly (2^(s-1) would overflow bf16 for
    s > 128); the fp32 accumulator is multiplied by 2^64 once at the end. The two lanes of a word become adjacent K
    positions ("paired" K order: in each run of 8, position 2j + h holds element j + 4h), which is
    how tensor-core operand registers pair values; x and the activations are stored in that order.
Without inline PTX (the interpreter, or USE_INLINE_PTX = False) both paths decode through fp16.
"""

from __future__ import annotations

import math
import os
import weakref

import torch
import triton
import triton.language as tl

from gossamer.kernels import pdl
from gossamer.kernels.keys import NO_KEY, key_index, key_value, value_key
from gossamer.model import mxfp4 as mxfp4_format
from gossamer.ops.base import ExpertWeights

MXFP4_GROUP = 32  # elements per e8m0 scale
# T * top_k up to this uses the GEMV path. Below it, re-reading an expert that two tokens share
# costs little (at T=8, k=4, 128 experts: 32 expert reads vs ~28.4 distinct, +13% bytes) and the
# GEMV avoids the sort, the padded tensor-core tiles and ~10 extra small launches. Above it the
# grouped path reads each chosen expert once. benchmarks/kernels_moe.py times both around it.
# With the packed-fp16 GEMV the crossover moved up (H200, 2026-12-02, decode_speed.py): 120b
# steps at T=16 take 13.7 ms on the GEMV against 26.4 on the grouped path, at T=32 25.0 against
# 39.0; but 20b (32 experts) at T=32 took 15.9 ms on the GEMV against 13.8 at T=64 on the grouped
# path. The re-read bytes grow with pairs per expert, so the GEMV also stops at
# DECODE_PAIRS_PER_EXPERT * E pairs (T <= 16 for 20b, T <= 32 for 120b). With grouped v2 (same
# machine, 120b, PDL on): T=8 8.4 ms GEMV vs 11.2 v2, T=16 13.4 vs 16.2, T=32 25.1 vs 22.9.
# With the expert-grouped GEMV on (below), 32 (T <= 8 at top-4): that one wins from 16 tokens.
DECODE_MAX_PAIRS = int(os.environ.get("GOSSAMER_DECODE_MAX_PAIRS", "32"))  # (env: A/B runs)
# Pairs above the GEMV's limit and up to this many go to the expert-grouped packed-fp16 GEMV
# (moe_grouped_gemv.py), the rest to the grouped kernels. Measured on the H200 (2026-12-03,
# BENCHMARKS.md, fourth session): one 120b layer at 16 tokens 210 us against 254 (GEMV) and 337
# (v2); 120b decode steps at batch 16 11.36 -> 10.06 ms and 32 20.83 -> 16.58 ms, batch 64
# unchanged (its tiles lost there: 760 us against v2's 674), so it would stop at T <= 32 at
# top-4 (128; and DECODE_MAX_PAIRS 32). Sixth session: on by default it gave 9.96 ms at batch 16
# and 16.81 at 32, but tests/kernels/test_triton_model.py failed on the H200 with it: the small
# test model's logits after a 24-token prefill (96 pairs, this path) were 12.8% off the float32
# truth (bound 5%). Seventh session (benchmarks/grouped_gemv_diag.py on the H200): that model's
# MoE outputs with this path are within 0.35% of float32, bit-equal to the kernel run alone; the
# 12.8% is one position of the continuation where the Triton backend is that far off with the
# grouped GEMV off too (both bf16 backends have such single positions), which the test checked
# only because the greedy tokens took another (near-tie) turn. So it is on again.
GROUPED_GEMV_MAX_PAIRS = int(os.environ.get("GOSSAMER_GROUPED_GEMV_MAX_PAIRS", "128"))
DECODE_PAIRS_PER_EXPERT = 2

# Launch configurations (see benchmarks/kernels_moe.py for the sweep that picks them).
DECODE_GATE_UP = {"BLOCK_PAIRS": 32, "GROUPS_PER_STEP": 16, "num_warps": 4}
DECODE_DOWN = {"BLOCK_ROWS": 4, "GROUPS_PER_STEP": 16, "num_warps": 2}
# The packed-fp16 GEMV (moe_mxfp4_decode_fp16) serves the decode path when this is on. Measured
# on the H200 (2026-12-02, benchmarks/moe_decode_sweep.py, T=1, gpt-oss-120b shapes): the whole
# MoE layer in 33.0 us against 53.6 us for the fp32 GEMV (floor 12.5 us); 120b batch-1 decode
# 3.30 ms per step against 4.01 ms. The configs are the sweep's best.
DECODE_FP16 = True
# Third session's sweep (benchmarks/moe_decode_sweep.py, H200, with PDL): gate_up 16 pairs x 16
# groups on 4 warps, down one row (x 4 experts) x 16 groups on 1 warp: 28.6 us per T=1 layer
# against 33.4 for the second session's configs (gate_up 16 x 8 on 2 warps, down 4 x 16 on 4).
# gate_up's EARLY (its expert from the router logits, its first words before the PDL wait) is off:
# in the graph (H200, 2026-12-04, fusion_ab.py gate_up_early) 20b 1.506 -> 1.511 ms, 120b 2.120
# -> 2.128.
# SCALES_T 1 loads the scales through transposed pointers. In this tile (triton 3.6, sm_90) the
# scales' load layout is not the group sums', and the accumulators followed the scales: each step
# moved both accumulators through shared memory (4 stores, 4 loads, 4 barriers a step, for all 4
# warps). Transposed, the scale load takes the group sums' layout: none of it, 337 -> 328
# instructions a loop (benchmarks/sass_counts.py prints both). On with WHOLE_STEPS (below); alone
# not measured in the graph (fusion_ab.py gate_up_scales_t).
# WHOLE_STEPS n > 0 (both configs): where a row's programs see only real rows (and down only real
# slots) and K is not split, the whole steps of 16 groups load without predicates (no zeroed
# registers a load, no bounds compares) and only the last, partial step (10 groups on 120b and
# 20b) is masked; n unrolls the whole steps' loop. Offline (sm_90, triton 3.6, 120b shapes,
# instructions a program's thread runs, session 37): gate_up 2,186 -> 1,954 (n 1; 70 registers
# against 78) / 1,906 (2; 88) / 1,791 (4, the loop gone; 90); down 1,424 -> 1,322 (1; 126
# against 76) / 1,117 (2; 78) / 1,063 (4; 68); gate_up with SCALES_T 2,177 -> 1,809 at n 2 (76
# registers) and 1,743 at n 4 (64), one barrier a program instead of one a step
# (`sass_counts.py --whole-steps`). In the graph (H100, fusion_ab.py, fed batch 1, session 37):
# 120b 2.447 -> 2.413 ms a step with n 2 and SCALES_T (5 of 5 rounds; n 4 with SCALES_T 2.436,
# n 4 without 2.563, n 1 2.487), but 20b, whose GEMVs route themselves, 1.737 -> 1.777 (n 4 with
# SCALES_T 1.739): on where the routing kernel runs (ROUTING_GEMV_CHANGES keeps the routing
# GEMVs on the masked loop). Not yet timed on an H200.
DECODE_FP16_GATE_UP = {"BLOCK_PAIRS": 16, "GROUPS_PER_STEP": 16, "SPLIT_K": 1, "num_warps": 4,
                       "WHOLE_STEPS": 2, "SCALES_T": 1}  # fmt: skip
# GATE_UP_PREFETCH_L2 (an experiment, off): gate_up's programs ask for their whole block of rows
# in L2 as they start (1: the 2 x 16 rows' scales, 2.9 KB on 120b; 2: their words too, 46 KB), so
# that a one-wave launch has its 33 MB (4 experts) requested at once rather than two steps at a
# time, and the step loads hit L2. Why: ncu (session 39, H100) put 75% of gate_up's warp samples
# at long_scoreboard, ~19% on scale bytes loaded 150-200 instructions before their use, at 63% of
# DRAM throughput. fusion_ab.py gu_l2_scales / gu_l2_words time it.
# Loading a step ahead (see the section comment above _down_ahead), measured twice on the H200
# (sessions 7 and 8, moe_decode_sweep.py --ahead, T=1 layer on 120b shapes). Session 8, us per
# layer by gate_up/down AHEAD (1: scales a step early, 2: activation words too): 0/0 26.5,
# 0/1 26.1, 0/2 24.9, 1/0 26.8, 1/1 26.5, 1/2 25.1, 2/0 29.3, 2/1 28.8, 2/2 27.7. gate_up lost
# both times (+0.2..0.4 us with 1, +2.4..2.8 with 2) and down's 1 was never the best, so those
# were removed: only down loads ahead, with AHEAD 2 (0 turns it off).
# EARLY 1: the first step's words and scales are loaded before the PDL wait (in the graph, H200,
# 2026-12-04, fusion_ab.py: 20b 1.501 -> 1.491 ms a step, 120b 2.115 -> 2.109).
DECODE_FP16_DOWN = {"BLOCK_ROWS": 1, "GROUPS_PER_STEP": 16, "SPLIT_K": 1, "num_warps": 1,
                    "AHEAD": 2, "EARLY": 1, "WHOLE_STEPS": 2}  # fmt: skip
# What the GEMVs that route themselves (moe_from_logits) change in the configs above.
ROUTING_GEMV_CHANGES = {"WHOLE_STEPS": 0, "SCALES_T": 0}
GROUPED_GATE_UP = {"BLOCK_PAIRS": 64, "GROUPS_PER_STEP": 4, "num_warps": 4}
GROUPED_DOWN = {"BLOCK_COLS": 128, "GROUPS_PER_STEP": 4, "num_warps": 4}
# Grouped kernels keep the accumulator transposed (weights as the tensor cores' M operand) up to
# this BLOCK_M: fewer instructions per weight at 16 and 32 rows, register spills at 64 (sm_90 SASS).
SWAP_AB_MAX_BLOCK_M = 32

# int32 masks for two fp16 lanes of a word. 0x80008000 does not fit an int32 literal, so it is
# written as the signed value with the same bits.
_MAG_PAIR = tl.constexpr(0x0E000E00)
_SIGN_PAIR = tl.constexpr(0x80008000 - (1 << 32))
_FP16_OFFSET_EXP = tl.constexpr(14)  # fp16-encoded e2m1 values are e2m1 * 2^-14
# Bit layouts of the packed weights within each int32 word (gossamer/model/mxfp4.py): the
# published one, FP16_LANES (the loader's default on the GPU: a cheaper fp16 unpack) and the
# LANES_* layouts (cheaper bf16 unpacks, dearer fp16 ones), codes 2 and up (`_layout_lanes`).
LAYOUT_HF, LAYOUT_FP16_LANES = 0, 1
_IS_FP16_LANES = tl.constexpr(LAYOUT_FP16_LANES)  # the kernels' name for it
_LAYOUT_CODES = {name: code for code, name in enumerate(mxfp4_format.LAYOUTS)}
assert _LAYOUT_CODES[mxfp4_format.LAYOUT_FP16_LANES] == LAYOUT_FP16_LANES
_KEEP_PAIR = tl.constexpr(0x8E008E00 - (1 << 32))  # _MAG_PAIR | _SIGN_PAIR
# FP16_LANES: the bits of registers 2 and 3 (mxfp4.FP16_LANE_BITS (3, 14) and (0, 13), both lanes)
_FP16_LANES_MASK2 = tl.constexpr(0x40384038)
_FP16_LANES_MASK3 = tl.constexpr(0x20072007)


# Triton decides interpreter or compiler as kernels are decorated, from this variable; kernels
# that contain inline PTX read it to run plain-Triton twins of the PTX in the interpreter.
_INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


def layout_code(experts: ExpertWeights) -> int:
    """The kernels' LAYOUT constexpr for these experts' packed words."""
    if experts.layout not in _LAYOUT_CODES:
        raise MoEShapeError(f"unknown MXFP4 layout {experts.layout!r}")
    return _LAYOUT_CODES[experts.layout]


def layout_code_of(name: str) -> int:
    """The LAYOUT constexpr of the mxfp4.LAYOUTS layout `name`."""
    return _LAYOUT_CODES[name]


def _require_published_layout(experts: ExpertWeights, path: str) -> None:
    if experts.layout != mxfp4_format.LAYOUT_HF:
        raise MoEShapeError(f"{path} reads only the published MXFP4 layout, got {experts.layout!r}")


def _is_interpreted(kernel: object) -> bool:
    """True when TRITON_INTERPRET was set as the kernels were defined (decorated)."""
    return type(kernel).__name__ == "InterpretedFunction"


class MoEShapeError(ValueError):
    """The MoE inputs do not fit together (wrong shapes, dtypes or top_k)."""


# ----------------------------------------------------------------------------------------------
# Shared device helpers
# ----------------------------------------------------------------------------------------------


# The kernels build their scales without a clamp (one IMAD a bf16 scale pair instead of a min,
# an add, a mask and a multiply): the loader checks that every expert's e8m0 exponent is at most
# mxfp4.KERNEL_MAX_SCALE (192: weights below 2^65). With v2's 12-instruction unpack of the
# repacked words (`_v2_fp16_layout_bits`), v2's 8-row gate_up loop as the GPU runs it takes 447
# instructions instead of 491 (sm_90 SASS, benchmarks/sass_counts.py), the batch-1 gate_up 317
# instead of 328. Measured on an H100 (session 27, interleaved runs): one 120b MoE layer at 64
# tokens 625.0 -> 615.5 us, `throughput.py --concurrency 64` 2,222.2 / 2,231.0 -> 2,273.2 tok/s,
# batch 1 unchanged (395.5 -> 397.5).


@triton.jit
def _e8m0_scale(scales):
    """uint8 e8m0 exponents s -> fp32 2^(s-127) * 2^14 (undoes the fp16 encoding's 2^-14)."""
    biased = scales.to(tl.int32) + _FP16_OFFSET_EXP
    return (biased << 23).to(tl.float32, bitcast=True)


@triton.jit
def _bf16_scale_pairs(scales):
    """uint8 e8m0 exponents s (<= mxfp4.KERNEL_MAX_SCALE) -> int32 bf16x2 words, both lanes
    2^(s-65): the exponent s + 62 in bits 7..14 of each lane, written as one multiply-add."""
    return scales.to(tl.int32) * 0x00800080 + (126 - _LANE_SHIFT) * 0x00800080


_UNPACK_PTX = tl.constexpr(
    """{
    .reg .b16 l0, h0, l1, h1, l2, h2, l3, h3;
    mov.b32 {l0, h0}, $8;
    mov.b32 {l1, h1}, $9;
    mov.b32 {l2, h2}, $10;
    mov.b32 {l3, h3}, $11;
    cvt.f32.f16 $0, l0;
    cvt.f32.f16 $1, h0;
    cvt.f32.f16 $2, l1;
    cvt.f32.f16 $3, h1;
    cvt.f32.f16 $4, l2;
    cvt.f32.f16 $5, h2;
    cvt.f32.f16 $6, l3;
    cvt.f32.f16 $7, h3;
}"""
)


@triton.jit
def _unpack_halves(p0, p1, p2, p3, PTX: tl.constexpr):
    """Four int32 tensors of fp16 pairs -> (low, high lane of p0, of p1, ...) as fp32 (exact)."""
    if PTX:
        # NOTE: the plain path below makes LLVM repack the int16 truncations with PRMTs; this
        # unpack becomes one HADD2.F32 per value (the lane select is free) on sm_80+.
        return tl.inline_asm_elementwise(
            asm=_UNPACK_PTX,
            constraints="=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r",
            args=[p0, p1, p2, p3],
            dtype=(tl.float32,) * 8,
            is_pure=True,
            pack=1,
        )
    else:
        return (
            p0.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32),
            (p0 >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32),
            p1.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32),
            (p1 >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32),
            p2.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32),
            (p2 >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32),
            p3.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32),
            (p3 >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32),
        )


@triton.jit
def _word_products(words, x0, x1, x2, x3, x4, x5, x6, x7, PTX: tl.constexpr):
    """sum_i e2m1(code i of each word) * 2^-14 * x_i, elementwise over the words' shape.

    words: int32, 8 codes each; x_i: fp32 broadcastable to words, x_i matching code i.
    Codes j and j+4 sit 16 bits apart, so one pair of shifts and masks makes both fp16 lanes.
    Written as one multiply-add chain so that it compiles to FFMAs."""
    p0 = ((words << 9) & _MAG_PAIR) | ((words << 12) & _SIGN_PAIR)  # codes 0 and 4
    p1 = ((words << 5) & _MAG_PAIR) | ((words << 8) & _SIGN_PAIR)  # codes 1 and 5
    p2 = ((words << 1) & _MAG_PAIR) | ((words << 4) & _SIGN_PAIR)  # codes 2 and 6
    p3 = ((words >> 3) & _MAG_PAIR) | (words & _SIGN_PAIR)  # codes 3 and 7
    w0, w4, w1, w5, w2, w6, w3, w7 = _unpack_halves(p0, p1, p2, p3, PTX)
    acc = w0 * x0
    acc += w4 * x4
    acc += w1 * x1
    acc += w5 * x5
    acc += w2 * x2
    acc += w6 * x6
    acc += w3 * x3
    acc += w7 * x7
    return acc


_BF16_PAIR_PTX = tl.constexpr(
    """{
    .reg .b32 negzero;
    mov.b32 negzero, 0x80008000;
    fma.rn.bf16x2 $0, $1, $3, negzero;
}"""
)


@triton.jit
def _scaled_bf16_pairs(pairs, scale_pairs):
    """bf16x2 words (e2m1 * 2^-126 per lane) times bf16x2 scales (2^(s-1)) -> [..., 2] bf16.

    The words are passed twice (join) so that with pack=2 one asm instance sees one word and
    returns its two lanes as consecutive elements of the last axis."""
    return tl.inline_asm_elementwise(
        asm=_BF16_PAIR_PTX,
        constraints="=r,r,r,r,r",
        args=[tl.join(pairs, pairs), tl.join(scale_pairs, scale_pairs)],
        dtype=tl.bfloat16,
        is_pure=True,
        pack=2,
    )


# bf16 lanes decode to weight * 2^-LANE_SHIFT (see _dequant_words); accumulators are rescaled once.
_LANE_SHIFT = tl.constexpr(64)
_LANE_RESCALE = tl.constexpr(2.0**64)
LANES_FP16 = 0  # plain Triton: fp16 lanes -> fp32 (the interpreter; USE_INLINE_PTX = False)
LANES_BF16_PTX = 1  # bf16 lanes scaled by one packed bf16 fma (inline PTX, the GPU default)
LANES_BF16_EMULATED = 2  # the same bf16 lane arithmetic in fp32, for the CPU tests


@triton.jit
def _dequant_words(words, scales, LANES: tl.constexpr):
    """words [R, GB, 4] int32 (8 e2m1 codes each) + scales [R, GB] uint8 -> [R, GB * 32] weights
    in the "paired" K order: bf16 (LANES_BF16_PTX) or fp32, exact; the bf16-lane modes return
    weight * 2^-64, so their dot products need one final * 2^64 (_LANE_RESCALE).

    For each of the four code pairs (j, j+4) of a word, one shift-and-mask pair gives a 2-lane word.
    Paired K order: within each run of 8 elements, position 2j + h holds element j + 4h, so both
    lanes of one word are adjacent, as a tensor-core operand register wants them (no lane
    shuffles). The activations are stored in the same order (`_paired_index`): a dot does not
    mind a K permutation both operands share."""
    if LANES == 0:
        p0 = ((words << 9) & _MAG_PAIR) | ((words << 12) & _SIGN_PAIR)
        p1 = ((words << 5) & _MAG_PAIR) | ((words << 8) & _SIGN_PAIR)
        p2 = ((words << 1) & _MAG_PAIR) | ((words << 4) & _SIGN_PAIR)
        p3 = ((words >> 3) & _MAG_PAIR) | (words & _SIGN_PAIR)
        w0, w4, w1, w5, w2, w6, w3, w7 = _unpack_halves(p0, p1, p2, p3, False)
        scale = _e8m0_scale(scales)[:, :, None]
        q0 = tl.join(w0 * scale, w4 * scale)
        q1 = tl.join(w1 * scale, w5 * scale)
        q2 = tl.join(w2 * scale, w6 * scale)
        q3 = tl.join(w3 * scale, w7 * scale)
    else:
        # bf16 lanes: magnitude bits to 6..8, sign to 15, i.e. e2m1 * 2^-126 (the e2m1 subnormal
        # 0.5 lands on a bf16 subnormal, which bf16 fma keeps). Scaling by 2^(s-1) would give the
        # weight, but overflows bf16 for s > 128; 2^(s-1-64) fits for every s <= 192 (weights
        # below 2^65) and keeps every product normal in the fp32 accumulator.
        scale_pairs = _bf16_scale_pairs(scales)[:, :, None]  # both lanes 2^(s-65)
        p0 = ((words << 6) & 0x01C001C0) | ((words << 12) & _SIGN_PAIR)
        p1 = ((words << 2) & 0x01C001C0) | ((words << 8) & _SIGN_PAIR)
        p2 = ((words >> 2) & 0x01C001C0) | ((words << 4) & _SIGN_PAIR)
        p3 = ((words >> 6) & 0x01C001C0) | (words & _SIGN_PAIR)
        if LANES == 1:
            q0 = _scaled_bf16_pairs(p0, scale_pairs)
            q1 = _scaled_bf16_pairs(p1, scale_pairs)
            q2 = _scaled_bf16_pairs(p2, scale_pairs)
            q3 = _scaled_bf16_pairs(p3, scale_pairs)
        else:
            q0 = _emulated_bf16_pairs(p0, scale_pairs)
            q1 = _emulated_bf16_pairs(p1, scale_pairs)
            q2 = _emulated_bf16_pairs(p2, scale_pairs)
            q3 = _emulated_bf16_pairs(p3, scale_pairs)
    values = tl.join(tl.join(q0, q1), tl.join(q2, q3))  # [R, GB, 4, 2(h), 2(j&1), 2(j>>1)]
    values = tl.permute(values, (0, 1, 2, 5, 4, 3))  # [R, GB, 4, 2(j>>1), 2(j&1), 2(h)]
    return tl.reshape(values, (words.shape[0], words.shape[1] * 32))


@triton.jit
def _emulated_bf16_pairs(pairs, scale_pairs):
    """What _scaled_bf16_pairs computes, in fp32, from the same bf16x2 words: each bf16 lane is
    the top half of an fp32, and the products are exact in both."""
    low = (pairs << 16).to(tl.float32, bitcast=True)
    high = (pairs & -65536).to(tl.float32, bitcast=True)  # -65536 == 0xFFFF0000
    low_scale = (scale_pairs << 16).to(tl.float32, bitcast=True)
    high_scale = (scale_pairs & -65536).to(tl.float32, bitcast=True)
    return tl.join(low * low_scale, high * high_scale)


@triton.jit
def _paired_index(k):
    """Position of element k in the paired K order: 8q + j + 4h -> 8q + 2j + h."""
    return (k // 8) * 8 + (k % 4) * 2 + (k % 8) // 4


@triton.jit
def _swiglu(gate, up, limit, alpha):
    gate = tl.minimum(gate, limit)
    up = tl.minimum(tl.maximum(up, -limit), limit)
    return gate * tl.sigmoid(alpha * gate) * (up + 1.0)


# ----------------------------------------------------------------------------------------------
# Routing
# ----------------------------------------------------------------------------------------------


@triton.jit
def _route_kernel(
    logits_ptr,  # [T, E]
    ids_ptr,  # [T * TOP_K] int32 out
    weights_ptr,  # [T * TOP_K] fp32 out
    x_ptr,  # [T, H] (read unless X_LAYOUT == 0)
    x_out_ptr,  # X_LAYOUT 1: [T, 8, H/8] fp32 nibble planes; 2: [T, H] paired K order;
    # 3: [T, H] fp16 pair planes (see _group_dot), scaled by 2^e_t (max |x| * 2^e_t in [2^14, 2^15))
    # 4: [T, HP] the grouped v2 step order (_v2_position; HP = H padded to whole steps); 5: the
    # same in the mma.sync order (`_v2_sync_order`)
    x_unscale_ptr,  # X_LAYOUT 3: [T] fp32 out, 2^-e_t
    logits_row_stride,
    E: tl.constexpr,
    E_P2: tl.constexpr,
    TOP_K: tl.constexpr,
    K_P2: tl.constexpr,
    H: tl.constexpr,
    X_LAYOUT: tl.constexpr,
    BLOCK_H: tl.constexpr,
    V2_GROUPS: tl.constexpr = 4,  # X_LAYOUT 4: scale groups per step of the v2 gate_up kernel
    PDL: tl.constexpr = False,  # see gossamer/kernels/pdl.py
    TOPK_KEYS: tl.constexpr = False,  # the top-k by packed keys (TOP_K_KEYS)
):
    token = tl.program_id(0)
    expert = tl.arange(0, E_P2)
    pdl.wait(PDL)
    ONE_PASS: tl.constexpr = X_LAYOUT == 3 and BLOCK_H >= H
    if ONE_PASS:  # the whole row in registers, loaded beside the logits (decode: one trip to L2)
        k_row = tl.arange(0, BLOCK_H)
        x_row = tl.load(x_ptr + token * H + k_row, mask=k_row < H, other=0.0).to(tl.float32)
    logits = tl.load(
        logits_ptr + token * logits_row_stride + expert, mask=expert < E, other=float("-inf")
    ).to(tl.float32)
    _top_k_softmax(logits, expert, ids_ptr + token * TOP_K, weights_ptr + token * TOP_K,
                   E, E_P2, TOP_K, K_P2, TOPK_KEYS)  # fmt: skip

    if X_LAYOUT == 1:
        for start in tl.static_range(0, H, BLOCK_H):
            k = start + tl.arange(0, BLOCK_H)
            values = tl.load(x_ptr + token * H + k, mask=k < H, other=0.0).to(tl.float32)
            tl.store(x_out_ptr + token * H + (k % 8) * (H // 8) + k // 8, values, mask=k < H)
    elif X_LAYOUT == 2:
        for start in tl.static_range(0, H, BLOCK_H):
            k = start + tl.arange(0, BLOCK_H)
            values = tl.load(x_ptr + token * H + k, mask=k < H, other=0.0)
            tl.store(x_out_ptr + token * H + _paired_index(k), values, mask=k < H)
    elif X_LAYOUT == 4 or X_LAYOUT == 5:
        HP: tl.constexpr = (H // 32 + V2_GROUPS - 1) // V2_GROUPS * V2_GROUPS * 32
        # outside the loop: unrolled, a constexpr would be reassigned
        SYNC: tl.constexpr = X_LAYOUT == 5
        for start in tl.static_range(0, H, BLOCK_H):
            k = start + tl.arange(0, BLOCK_H)
            values = tl.load(x_ptr + token * H + k, mask=k < H, other=0.0)
            position = _v2_position(k, V2_GROUPS, SYNC)
            tl.store(x_out_ptr + token * HP + position, values, mask=k < H)
    elif ONE_PASS:
        _store_fp16_planes(x_row, k_row, x_out_ptr + token * H, x_unscale_ptr + token, H)
    elif X_LAYOUT == 3:  # x * 2^e_t: the row's max first, then the stores
        amax = 0.0
        for start in tl.static_range(0, H, BLOCK_H):
            k = start + tl.arange(0, BLOCK_H)
            values = tl.load(x_ptr + token * H + k, mask=k < H, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.max(tl.abs(values), axis=0))
        scale = _fp16_row_scale(amax, x_unscale_ptr + token)
        for start in tl.static_range(0, H, BLOCK_H):
            k = start + tl.arange(0, BLOCK_H)
            values = tl.load(x_ptr + token * H + k, mask=k < H, other=0.0).to(tl.float32)
            scaled = (values * scale).to(x_out_ptr.dtype.element_ty)
            tl.store(x_out_ptr + token * H + _pair_plane_index(k, H), scaled, mask=k < H)


@triton.jit
def _top_k_softmax(logits, expert, ids_ptr, weights_ptr, E: tl.constexpr, E_P2: tl.constexpr,
                   TOP_K: tl.constexpr, K_P2: tl.constexpr, KEYS: tl.constexpr = False):  # fmt: skip
    """Store the TOP_K largest of fp32 logits [E_P2] (-inf past E) as ids (ties: the lower
    expert) and their softmax weights, at ids_ptr[0:TOP_K] and weights_ptr[0:TOP_K]."""
    slot = tl.arange(0, K_P2)
    top_ids, weights = _top_k_weights(logits, expert, E, E_P2, TOP_K, K_P2, KEYS)
    tl.store(ids_ptr + slot, top_ids, mask=slot < TOP_K)
    tl.store(weights_ptr + slot, weights, mask=slot < TOP_K)


@triton.jit
def _top_k_weights(logits, expert, E: tl.constexpr, E_P2: tl.constexpr, TOP_K: tl.constexpr,
                   K_P2: tl.constexpr, KEYS: tl.constexpr = False):  # fmt: skip
    """The TOP_K largest of fp32 logits [E_P2] (-inf past E) -> (ids [K_P2] (ties: the lower
    expert), their softmax weights [K_P2]); slots past TOP_K hold expert 0 with weight 0."""
    top_logits, top_ids = _top_k(logits, expert, E, E_P2, TOP_K, K_P2, KEYS)
    valid = tl.arange(0, K_P2) < TOP_K
    exps = tl.where(valid, tl.exp(top_logits - tl.max(top_logits, axis=0)), 0.0)
    return tl.where(valid, top_ids, 0), exps / tl.sum(exps, axis=0)


@triton.jit
def _top_k(logits, expert, E: tl.constexpr, E_P2: tl.constexpr, TOP_K: tl.constexpr,
           K_P2: tl.constexpr, KEYS: tl.constexpr = False):  # fmt: skip
    """The TOP_K largest of fp32 logits [E_P2] (-inf past E), largest first -> (logits [K_P2],
    ids [K_P2]; ties: the lower expert). KEYS: the same by `_top_k_keys`."""
    if KEYS:
        return _top_k_keys(logits, expert, E, E_P2, TOP_K, K_P2)
    slot = tl.arange(0, K_P2)
    top_logits = tl.full([K_P2], float("-inf"), tl.float32)
    top_ids = tl.zeros([K_P2], tl.int32)
    for k in tl.static_range(TOP_K):
        best = tl.max(logits, axis=0)
        # NOTE: clamped so that NaN logits (no match) give garbage, not out-of-bounds reads.
        best_id = tl.minimum(tl.min(tl.where(logits == best, expert, E_P2), axis=0), E - 1)
        top_logits = tl.where(slot == k, best, top_logits)
        top_ids = tl.where(slot == k, best_id, top_ids)
        logits = tl.where(expert == best_id, float("-inf"), logits)
    return top_logits, top_ids


# Packed top-k keys (TOP_K_KEYS): each slot of `_top_k` is two dependent reductions across the
# program's threads (the max logit, then the lowest expert holding it), and with 128 experts over 4
# warps each is a trip through shared memory. One int64 key per expert, the logit's bits made
# order-preserving above the expert's rank below, makes it one max a slot with the same winners
# (ties: the lower expert) and the same routing weights. In the graph (H200, fusion_ab.py,
# fed, 2026-12-04, 5 of 5 rounds): 120b's routing kernel with it -10 us a step, but 20b's expert
# GEMVs routing themselves (32 experts: one warp, no shared memory to save) +9 us, so those keep
# the two reductions (the keys there were removed in session 36). Nor did the keys make routing
# inside the expert GEMVs pay at 128 experts (route_in_all_keys: +38 us against the routing
# kernel), so ROUTE_IN_EXPERTS_MAX_EXPERTS stays. (env: A/B runs)
TOP_K_KEYS = os.environ.get("GOSSAMER_TOP_K_KEYS", "1") == "1"


@triton.jit
def _top_k_keys(logits, expert, E: tl.constexpr, E_P2: tl.constexpr, TOP_K: tl.constexpr,
                K_P2: tl.constexpr):  # fmt: skip
    """`_top_k` with one reduction a slot (keys.value_key: ties go to the lower expert, and -0.0
    ties +0.0, as `_top_k` compares them)."""
    keys = value_key(logits, expert, E_P2)
    slot = tl.arange(0, K_P2)
    top_logits = tl.full([K_P2], float("-inf"), tl.float32)
    top_ids = tl.zeros([K_P2], tl.int32)
    for k in tl.static_range(TOP_K):
        best = tl.max(keys, axis=0)
        # NOTE: clamped so that NaN logits give garbage, not out-of-bounds reads (as _top_k)
        best_id = tl.minimum(key_index(best, E_P2).to(tl.int32), E - 1)
        best_logit = key_value(best)
        top_logits = tl.where(slot == k, best_logit, top_logits)
        top_ids = tl.where(slot == k, best_id, top_ids)
        keys = tl.where(keys == best, NO_KEY, keys)
    return top_logits, top_ids


@triton.jit
def _routed_expert(logits_row_ptr, k, E: tl.constexpr, E_P2: tl.constexpr, TOP_K: tl.constexpr,
                   K_P2: tl.constexpr):  # fmt: skip
    """The expert in slot k of a token's routing, from its logits row as `_route_kernel` reads
    it (the same top-k, by two reductions a slot: the same id as its packed keys give)."""
    expert = tl.arange(0, E_P2)
    logits = tl.load(logits_row_ptr + expert, mask=expert < E, other=float("-inf"),
                     cache_modifier=".cg").to(tl.float32)  # fmt: skip
    _, top_ids = _top_k(logits, expert, E, E_P2, TOP_K, K_P2)
    return tl.sum(tl.where(tl.arange(0, K_P2) == k, top_ids, 0), axis=0)


@triton.jit
def _store_fp16_planes(x_row, k_row, x_out_ptr, x_unscale_ptr, H: tl.constexpr):
    """x_row [BLOCK_H] fp32 (zero past H) as the fp16 GEMV's input: x * 2^e as pair planes at
    x_out_ptr, 2^-e at x_unscale_ptr (see _fp16_row_scale)."""
    scale = _fp16_row_scale(tl.max(tl.abs(x_row), axis=0), x_unscale_ptr)
    scaled = (x_row * scale).to(tl.float16)
    tl.store(x_out_ptr + _pair_plane_index(k_row, H), scaled, mask=k_row < H)


@triton.jit
def _fp16_row_scale(amax, x_unscale_ptr):
    """2^e with max |x| * 2^e in [2^14, 2^15); stores 2^-e at x_unscale_ptr."""
    # e = 14 - floor(log2(amax)), from amax's exponent bits; clamped for zero or tiny x
    floor_log2 = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = tl.minimum(tl.maximum(14 - floor_log2, -100), 100)
    tl.store(x_unscale_ptr, ((127 - e) << 23).to(tl.float32, bitcast=True))
    return ((127 + e) << 23).to(tl.float32, bitcast=True)


def route(
    router_logits: torch.Tensor, top_k: int, x: torch.Tensor | None = None, x_layout: str = "planes"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Top-k + softmax of router_logits [T, E] -> (ids [T*k] int32, weights [T*k] fp32, x_out).

    With x [T, H], x_out is a copy of x laid out for the next kernel: "planes" -> [T, 8, H/8] fp32
    nibble planes (GEMV path), "paired" -> [T, H] in x.dtype, paired K order (grouped path)."""
    ids, weights, x_out, _ = _route(router_logits, top_k, x, x_layout)
    return ids, weights, x_out


def route_fp16(
    router_logits: torch.Tensor, top_k: int, x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`route` for the packed-fp16 GEMV -> (ids, weights, x_h [T, H] fp16 pair planes (see _group_dot),
    scaled by 2^e_t per token, x_unscale [T] fp32 = 2^-e_t)."""
    return _route(router_logits, top_k, x, "fp16")


_X_LAYOUTS = {"planes": 1, "paired": 2, "fp16": 3, "v2": 4, "v2_sync": 5}


def _route(
    router_logits: torch.Tensor,
    top_k: int,
    x: torch.Tensor | None,
    x_layout: str,
    v2_groups: int = 4,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    num_tokens, num_experts = router_logits.shape
    device = router_logits.device
    ids = torch.empty(num_tokens * top_k, dtype=torch.int32, device=device)
    weights = torch.empty(num_tokens * top_k, dtype=torch.float32, device=device)
    hidden = x.shape[1] if x is not None else 8
    x_out = x_unscale = None
    if x is not None and x_layout == "planes":
        x_out = torch.empty(num_tokens, 8, hidden // 8, dtype=torch.float32, device=device)
    elif x is not None and x_layout == "fp16":
        x_out = torch.empty(num_tokens, hidden, dtype=torch.float16, device=device)
        x_unscale = torch.empty(num_tokens, dtype=torch.float32, device=device)
    elif x is not None and x_layout in ("v2", "v2_sync"):  # last step's holes: unread
        x_out = torch.empty(num_tokens, _v2_padded(hidden, v2_groups), dtype=x.dtype, device=device)
    elif x is not None:
        x_out = torch.empty_like(x)
    if num_tokens == 0:
        return ids, weights, x_out, x_unscale
    _route_kernel[(num_tokens,)](
        router_logits,
        ids,
        weights,
        x if x is not None else weights,
        x_out if x_out is not None else weights,
        x_unscale if x_unscale is not None else weights,
        router_logits.stride(0),
        E=num_experts,
        E_P2=triton.next_power_of_2(num_experts),
        TOP_K=top_k,
        K_P2=triton.next_power_of_2(top_k),
        H=hidden,
        X_LAYOUT=0 if x is None else _X_LAYOUTS[x_layout],
        BLOCK_H=_route_block(hidden, x_layout if x is not None else None),
        V2_GROUPS=v2_groups,
        TOPK_KEYS=TOP_K_KEYS,
        num_warps=4 if x_layout != "fp16" else 8,
        **pdl.launch_options(router_logits.device),
    )
    return ids, weights, x_out, x_unscale


def _route_block(hidden: int, x_layout: str | None) -> int:
    """Columns of x per pass: the fp16 layout takes a row (up to 8192) in one pass (decode)."""
    if x_layout == "fp16" and hidden <= 8192:
        return triton.next_power_of_2(hidden)
    return min(1024, triton.next_power_of_2(hidden))


def route_reference(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The pure-torch twin of `route` (ids, weights) as TorchOps().moe computes them, in fp32."""
    top_logits, top_ids = torch.topk(router_logits.float(), top_k, dim=-1)
    return top_ids.flatten().to(torch.int32), torch.softmax(top_logits, dim=-1).flatten()


def _fp16_decode_problem(hidden, residual, router_weight, experts, top_k, swiglu_limit) -> bool:
    """A layer half whose MoE the fp16 GEMV path serves (decode-sized, MXFP4, a finite limit)."""
    num_tokens, num_experts = hidden.shape[0], router_weight.shape[0]
    max_pairs = min(DECODE_MAX_PAIRS, DECODE_PAIRS_PER_EXPERT * num_experts)
    return (
        DECODE_FP16
        and experts.is_mxfp4
        and 0.0 < swiglu_limit < 1e4
        and hidden.dim() == 2
        and 1 <= num_tokens * top_k <= max_pairs
        and (residual is None or (residual.dtype, residual.shape) == (hidden.dtype, hidden.shape))
        and router_weight.shape[1] == hidden.shape[1]
    )


# Decode batches without a routing kernel: the post-attention norm also writes the experts' fp16
# input (norm.rms_norm_planes), and gate_up and down find their experts from the router logits
# themselves (gate_up after its PDL wait, down before it), so a layer is eight launches, not nine.
# Only up to ROUTE_IN_EXPERTS_MAX_EXPERTS experts: each program's top-k grows with them. In the
# graph (H200, 2026-12-04, fusion_ab.py routing_kernel, fed batch 1): gpt-oss-20b (32 experts)
# 1.485 -> 1.461 ms a step, gpt-oss-120b (128) 2.096 -> 2.142. (env: A/B runs) The norm, the
# router and the routing in one launch (an arrival counter, the last program adding the partial
# logits) was slower (H200, session 5, fusion_ab.py: 120b 2.602 ms a step against 2.511 for three
# launches, 20b 1.852 against 1.796: the last program's serial tail costs more than the launches
# it saves) and was removed in session 36.
ROUTE_IN_EXPERTS = os.environ.get("GOSSAMER_ROUTE_IN_EXPERTS", "1") != "0"
ROUTE_IN_EXPERTS_MAX_EXPERTS = 32


def routes_in_experts(*problem) -> bool:
    """Whether TritonOps.norm_moe takes the norm -> router -> `moe_from_logits` path (`problem`:
    hidden, residual, router_weight, experts, top_k, swiglu_limit): problems that the fp16 GEMV
    path serves, gate_up unsplit."""
    hidden, router_weight = problem[0], problem[2]
    return (
        ROUTE_IN_EXPERTS
        and router_weight.shape[0] <= ROUTE_IN_EXPERTS_MAX_EXPERTS
        and _fp16_decode_problem(*problem)
        and DECODE_FP16_GATE_UP["SPLIT_K"] == 1
        and hidden.shape[1] % 8 == 0
    )


def moe_from_logits(
    normed: torch.Tensor,  # [T, H] the normed rows (for their shape and dtype)
    x_h: torch.Tensor,  # [T, H] fp16 pair planes of normed (norm.rms_norm_planes)
    x_unscale: torch.Tensor,  # [T] fp32
    router_logits: torch.Tensor,  # [T, E]
    experts: ExpertWeights,
    top_k: int,
    swiglu_limit: float,
    swiglu_alpha: float,
) -> torch.Tensor:
    """`moe_mxfp4_decode_fp16(normed, router_logits, ...)` without its routing launch: the two
    expert GEMVs take the top-k and softmax of the logits themselves (the same arithmetic as the
    routing kernel, so the same experts and weights) -> [T, H] in normed's dtype."""
    _, _, _, inter = _check(normed, router_logits, experts, top_k)
    out = torch.empty_like(normed)
    if normed.shape[0] > 0:
        _fp16_experts(x_h, x_unscale, None, None, experts, out, inter, top_k, swiglu_limit,
                      swiglu_alpha, router_logits=router_logits)  # fmt: skip
    return out


# ----------------------------------------------------------------------------------------------
# Decode path: GEMV kernels
# ----------------------------------------------------------------------------------------------


@triton.jit
def _decode_gate_up_kernel(
    x_planes_ptr,  # [T, 8, H/8] fp32
    ids_ptr,  # [P] int32, P = T * TOP_K
    words_ptr,  # [E, 2I, H/32, 4] int32 (the packed bytes read as words)
    scales_ptr,  # [E, 2I, H/32] uint8
    bias_ptr,  # [E, 2I]
    act_ptr,  # [P, 8, INTER/8] fp32 out (nibble planes of the activation)
    limit,
    alpha,
    H: tl.constexpr,
    INTER: tl.constexpr,
    TOP_K: tl.constexpr,
    BLOCK_PAIRS: tl.constexpr,
    GROUPS_PER_STEP: tl.constexpr,
    PTX: tl.constexpr,
):
    G: tl.constexpr = H // 32  # scale groups (and 4-word runs) per row
    pid_n = tl.program_id(0)
    pair = tl.program_id(1)  # (token, slot) = divmod(pair, TOP_K)
    token = pair // TOP_K
    expert = tl.load(ids_ptr + pair).to(tl.int64)

    j = pid_n * BLOCK_PAIRS + tl.arange(0, BLOCK_PAIRS)  # intermediate index; rows 2j, 2j+1
    j_ok = j < INTER
    step = tl.arange(0, GROUPS_PER_STEP)
    word = tl.arange(0, 4)
    gate_rows = 2 * j
    gate_w_ptrs = (
        words_ptr
        + expert * (2 * INTER * G * 4)
        + gate_rows[:, None, None] * (G * 4)
        + step[None, :, None] * 4
        + word[None, None, :]
    )  # [BP, GB, 4]
    up_w_ptrs = gate_w_ptrs + G * 4
    gate_s_ptrs = scales_ptr + expert * (2 * INTER * G) + gate_rows[:, None] * G + step[None, :]
    up_s_ptrs = gate_s_ptrs + G
    # NOTE: x pointers are built with the weight tile's rank ([1, GB, 4]) so that the load gets the
    # weight tile's layout and the broadcast needs no shared-memory layout conversion.
    x_ptrs = x_planes_ptr + token * H + step[None, :, None] * 4 + word[None, None, :]  # plane 0
    PLANE: tl.constexpr = H // 8

    acc_gate = tl.zeros([BLOCK_PAIRS, GROUPS_PER_STEP], tl.float32)
    acc_up = tl.zeros([BLOCK_PAIRS, GROUPS_PER_STEP], tl.float32)
    # NOTE: weights for step g+1 are loaded before step g is computed (register double buffer),
    # so each thread keeps two steps of loads in flight. Masked weight and scale lanes are left
    # undefined on purpose: any bit pattern decodes to a finite value, and a masked group always
    # meets zero activations (rows past the end are never stored), so no registers are zeroed.
    w_mask = j_ok[:, None, None] & (step < G)[None, :, None]
    next_gate = tl.load(gate_w_ptrs, mask=w_mask)
    next_up = tl.load(up_w_ptrs, mask=w_mask)
    for g0 in range(0, G, GROUPS_PER_STEP):
        gate_words = next_gate
        up_words = next_up
        g1 = g0 + GROUPS_PER_STEP
        w_mask = j_ok[:, None, None] & (g1 + step < G)[None, :, None]
        next_gate = tl.load(gate_w_ptrs + g1 * 4, mask=w_mask)
        next_up = tl.load(up_w_ptrs + g1 * 4, mask=w_mask)

        group_ok = g0 + step < G
        s_mask = j_ok[:, None] & group_ok[None, :]
        gate_scale = _e8m0_scale(tl.load(gate_s_ptrs + g0, mask=s_mask))
        up_scale = _e8m0_scale(tl.load(up_s_ptrs + g0, mask=s_mask))
        x_mask = group_ok[None, :, None]
        xp = x_ptrs + g0 * 4
        x0 = tl.load(xp, mask=x_mask, other=0.0)
        x1 = tl.load(xp + PLANE, mask=x_mask, other=0.0)
        x2 = tl.load(xp + 2 * PLANE, mask=x_mask, other=0.0)
        x3 = tl.load(xp + 3 * PLANE, mask=x_mask, other=0.0)
        x4 = tl.load(xp + 4 * PLANE, mask=x_mask, other=0.0)
        x5 = tl.load(xp + 5 * PLANE, mask=x_mask, other=0.0)
        x6 = tl.load(xp + 6 * PLANE, mask=x_mask, other=0.0)
        x7 = tl.load(xp + 7 * PLANE, mask=x_mask, other=0.0)
        gate_part = _word_products(gate_words, x0, x1, x2, x3, x4, x5, x6, x7, PTX)
        up_part = _word_products(up_words, x0, x1, x2, x3, x4, x5, x6, x7, PTX)
        acc_gate += tl.sum(gate_part, axis=2) * gate_scale
        acc_up += tl.sum(up_part, axis=2) * up_scale

    bias_row = bias_ptr + expert * (2 * INTER) + gate_rows
    gate = tl.sum(acc_gate, axis=1) + tl.load(bias_row, mask=j_ok, other=0.0).to(tl.float32)
    up = tl.sum(acc_up, axis=1) + tl.load(bias_row + 1, mask=j_ok, other=0.0).to(tl.float32)
    act = _swiglu(gate, up, limit, alpha)
    tl.store(act_ptr + pair * INTER + (j % 8) * (INTER // 8) + j // 8, act, mask=j_ok)


@triton.jit
def _decode_down_kernel(
    act_ptr,  # [P, 8, INTER/8] fp32 (nibble planes)
    ids_ptr,  # [P] int32
    route_w_ptr,  # [P] fp32
    words_ptr,  # [E, H, INTER/32, 4] int32
    scales_ptr,  # [E, H, INTER/32] uint8
    bias_ptr,  # [E, H]
    out_ptr,  # [T, H] out
    H: tl.constexpr,
    INTER: tl.constexpr,
    TOP_K: tl.constexpr,
    K_P2: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    GROUPS_PER_STEP: tl.constexpr,
    PTX: tl.constexpr,
):
    G: tl.constexpr = INTER // 32
    PLANE: tl.constexpr = INTER // 8
    pid_n = tl.program_id(0)
    token = tl.program_id(1)
    slot = tl.arange(0, K_P2)
    slot_ok = slot < TOP_K
    pair = token * TOP_K + slot  # [K]
    expert = tl.load(ids_ptr + pair, mask=slot_ok, other=0).to(tl.int64)
    route_w = tl.load(route_w_ptr + pair, mask=slot_ok, other=0.0)

    row = pid_n * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_ok = row < H
    step = tl.arange(0, GROUPS_PER_STEP)
    word = tl.arange(0, 4)
    # Tiles are [rows, slots, groups, words]: the slot axis inside the row axis puts a thread's
    # repeated registers on rows, so each loaded activation value serves several rows.
    w_ptrs = (
        words_ptr
        + expert[None, :, None, None] * (H * G * 4)
        + row[:, None, None, None] * (G * 4)
        + step[None, None, :, None] * 4
        + word[None, None, None, :]
    )  # [BN, K, GB, 4]
    s_ptrs = (
        scales_ptr + expert[None, :, None] * (H * G) + row[:, None, None] * G + step[None, None, :]
    )  # [BN, K, GB]
    x_ptrs = (
        act_ptr
        + pair[None, :, None, None] * INTER
        + step[None, None, :, None] * 4
        + word[None, None, None, :]
    )  # [1, K, GB, 4]: the weight tile's rank, so its load needs no layout conversion
    row_slot_ok = row_ok[:, None] & slot_ok[None, :]  # [BN, K]

    acc = tl.zeros([BLOCK_ROWS, K_P2, GROUPS_PER_STEP], tl.float32)
    w_mask = row_slot_ok[:, :, None, None] & (step < G)[None, None, :, None]
    next_words = tl.load(w_ptrs, mask=w_mask)
    for g0 in range(0, G, GROUPS_PER_STEP):
        words = next_words
        g1 = g0 + GROUPS_PER_STEP
        w_mask = row_slot_ok[:, :, None, None] & (g1 + step < G)[None, None, :, None]
        next_words = tl.load(w_ptrs + g1 * 4, mask=w_mask)

        group_ok = g0 + step < G
        scale = _e8m0_scale(
            tl.load(s_ptrs + g0, mask=row_slot_ok[:, :, None] & group_ok[None, None, :])
        )
        x_mask = slot_ok[None, :, None, None] & group_ok[None, None, :, None]
        xp = x_ptrs + g0 * 4
        x0 = tl.load(xp, mask=x_mask, other=0.0)
        x1 = tl.load(xp + PLANE, mask=x_mask, other=0.0)
        x2 = tl.load(xp + 2 * PLANE, mask=x_mask, other=0.0)
        x3 = tl.load(xp + 3 * PLANE, mask=x_mask, other=0.0)
        x4 = tl.load(xp + 4 * PLANE, mask=x_mask, other=0.0)
        x5 = tl.load(xp + 5 * PLANE, mask=x_mask, other=0.0)
        x6 = tl.load(xp + 6 * PLANE, mask=x_mask, other=0.0)
        x7 = tl.load(xp + 7 * PLANE, mask=x_mask, other=0.0)
        part = _word_products(words, x0, x1, x2, x3, x4, x5, x6, x7, PTX)
        acc += tl.sum(part, axis=3) * scale

    bias = tl.load(bias_ptr + expert[None, :] * H + row[:, None], mask=row_slot_ok, other=0.0).to(
        tl.float32
    )  # [BN, K]
    per_slot = tl.sum(acc, axis=2) + bias
    out = tl.sum(per_slot * route_w[None, :], axis=1)
    tl.store(out_ptr + token * H + row, out.to(out_ptr.dtype.element_ty), mask=row_ok)


def moe_mxfp4_decode(
    x: torch.Tensor,
    router_logits: torch.Tensor,
    experts: ExpertWeights,
    top_k: int,
    swiglu_limit: float,
    swiglu_alpha: float,
    gate_up_config: dict[str, int] | None = None,
    down_config: dict[str, int] | None = None,
) -> torch.Tensor:
    """The GEMV path: best for a handful of tokens (each (token, slot) re-reads its expert).
    The configs override DECODE_GATE_UP / DECODE_DOWN (benchmark sweeps, fast CPU tests)."""
    num_tokens, hidden, num_experts, inter = _check(x, router_logits, experts, top_k)
    if not experts.is_mxfp4:
        raise MoEShapeError("the GEMV path needs MXFP4 experts; use moe_mxfp4_grouped for dense")
    _require_published_layout(experts, "the fp32 GEMV")
    x = x.contiguous()
    out = torch.empty_like(x)
    if num_tokens == 0:
        return out
    ids, route_w, x_planes = route(router_logits, top_k, x)
    num_pairs = num_tokens * top_k
    act = torch.empty(num_pairs, 8, inter // 8, dtype=torch.float32, device=x.device)
    gu = gate_up_config or DECODE_GATE_UP
    _decode_gate_up_kernel[(triton.cdiv(inter, gu["BLOCK_PAIRS"]), num_pairs)](
        x_planes,
        ids,
        experts.gate_up_blocks.view(torch.int32),
        experts.gate_up_scales,
        experts.gate_up_bias.contiguous(),
        act,
        float(swiglu_limit),
        float(swiglu_alpha),
        H=hidden,
        INTER=inter,
        TOP_K=top_k,
        PTX=_ptx(),
        **gu,
    )
    dn = down_config or DECODE_DOWN
    _decode_down_kernel[(triton.cdiv(hidden, dn["BLOCK_ROWS"]), num_tokens)](
        act,
        ids,
        route_w,
        experts.down_blocks.view(torch.int32),
        experts.down_scales,
        experts.down_bias.contiguous(),
        out,
        H=hidden,
        INTER=inter,
        TOP_K=top_k,
        K_P2=triton.next_power_of_2(top_k),
        PTX=_ptx(),
        **dn,
    )
    return out


# ----------------------------------------------------------------------------------------------
# Decode path, packed-fp16 variant: fewer instructions per weight
# ----------------------------------------------------------------------------------------------
# The fp32 GEMV above spends about 5.3 instructions per weight (SASS for sm_90: unpack, fp16 ->
# fp32 conversion, FFMA, x loads; benchmarks/sass_counts.py), so it is bound by instruction issue,
# not by HBM. This variant
# keeps each unpacked 2-lane word as it is and multiplies it with a packed fp16 pair of x in one
# HFMA2 (two products per instruction, no conversion), accumulating in fp16 only within one
# 32-element scale group; the group sums are converted to fp32 and scaled there.
#
# Range: weight lanes are e2m1 * 2^-14, so x is stored as fp16 pairs scaled per token by 2^e with
# max|x| * 2^e in [2^14, 2^15): a lane's sum of 16 products stays below 16 * 6 * 2 = 192 and
# products of inputs within 2^15 of the token's max stay normal. The activation of the down GEMV
# is bounded by the clamped SwiGLU (|act| <= limit * (limit + 1)), so it gets a fixed scale.
# Error: fp16 rounding within a group adds about 5e-4 relative error (rms, random weights) to the
# result, a third of the bf16 rounding of the output itself.
# Unpack: with the published bit layout each register of two lanes costs two shifts and two masks;
# on the GPU the loader repacks the words (model/mxfp4.py LAYOUT_FP16_LANES) so that the four
# registers of a word cost 9 instructions instead of 16. SASS offline (sm_90, triton 3.6, default
# configs), instructions per weight in the main loop: gate_up 3.30 -> 2.53, down 3.84 -> 3.09.


@triton.jit
def _fp16_lane(words, HIGH: tl.constexpr):
    """One fp16 lane of int32 words, as fp32 (exact)."""
    if HIGH:
        words = words >> 16
    return words.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _fp16_pair(low, high):
    """Two fp32 tensors -> int32 words holding (round-to-fp16(low), round-to-fp16(high))."""
    lo = low.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    hi = high.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32)
    return lo | (hi << 16)


@triton.jit
def _hfma2(a, b, c):
    """a * b + c on words of two fp16 lanes: one HFMA2 on the GPU; in the interpreter, which
    cannot run PTX, fp32 math rounded to fp16 per lane."""
    if _INTERPRETED:
        low = _fp16_lane(a, False) * _fp16_lane(b, False) + _fp16_lane(c, False)
        high = _fp16_lane(a, True) * _fp16_lane(b, True) + _fp16_lane(c, True)
        return _fp16_pair(low, high)
    else:
        return tl.inline_asm_elementwise(
            asm="fma.rn.f16x2 $0, $1, $2, $3;",
            constraints="=r,r,r,r",
            args=[a, b, c],
            dtype=tl.int32,
            is_pure=True,
            pack=1,
        )


@triton.jit
def _pair_lanes(words, PAIR: tl.constexpr, LAYOUT: tl.constexpr):
    """The fp16 lanes (e2m1 * 2^-14) of codes PAIR and PAIR + 4 of each int32 word."""
    if LAYOUT == _IS_FP16_LANES:
        return _fp16_layout_lanes(words, PAIR)
    elif LAYOUT > _IS_FP16_LANES:
        return _layout_lanes(words, PAIR, LAYOUT, False)
    if PAIR == 0:
        return ((words << 9) & _MAG_PAIR) | ((words << 12) & _SIGN_PAIR)
    elif PAIR == 1:
        return ((words << 5) & _MAG_PAIR) | ((words << 8) & _SIGN_PAIR)
    elif PAIR == 2:
        return ((words << 1) & _MAG_PAIR) | ((words << 4) & _SIGN_PAIR)
    else:
        return ((words >> 3) & _MAG_PAIR) | (words & _SIGN_PAIR)


@triton.jit
def _fp16_layout_lanes(words, PAIR: tl.constexpr):
    """`_pair_lanes` for LAYOUT_FP16_LANES words: 1, 2, 3 and 3 instructions for pairs 0..3 (the
    multiplies add two shifted copies of the masked bits; mxfp4.py's search checked that their
    carries never reach a kept bit)."""
    if PAIR == 0:
        return words & _KEEP_PAIR
    elif PAIR == 1:
        return (words << 3) & _KEEP_PAIR
    elif PAIR == 2:
        return ((words & _FP16_LANES_MASK2) * ((1 << 6) + (1 << 1))) & _KEEP_PAIR
    else:
        return ((words & _FP16_LANES_MASK3) * ((1 << 9) + (1 << 2))) & _KEEP_PAIR


@triton.jit
def _rotated(words, R: tl.constexpr):
    """int32 words rotated left by R bits (one funnel shift)."""
    if R == 0:
        return words
    else:
        bits = words.to(tl.uint32, bitcast=True)
        return ((bits << R) | (bits >> (32 - R))).to(tl.int32, bitcast=True)


@triton.jit
def _moved(words, R0: tl.constexpr, M0: tl.constexpr, R1: tl.constexpr, M1: tl.constexpr,
           R2: tl.constexpr, M2: tl.constexpr, MUL: tl.constexpr):  # fmt: skip
    """One register's bits moved by a recipe of `benchmarks/unpack_layouts.py`: with MUL,
    ((words & M0) * MUL) & M1 (shifted copies whose carries never reach a kept bit); else the OR
    over the nonzero masks M of rotate_left(words, R) & M."""
    if MUL != 0:
        return ((words & M0) * MUL) & M1
    else:
        out = _rotated(words, R0) & M0
        if M1 != 0:
            out = out | (_rotated(words, R1) & M1)
        if M2 != 0:
            out = out | (_rotated(words, R2) & M2)
        return out


@triton.jit
def _layout_lanes(words, J: tl.constexpr, LAYOUT: tl.constexpr, BF16: tl.constexpr):
    """Register J of each LANES_* word (codes J and J + 4) as two 16-bit lanes: fp16 e2m1 * 2^-14
    (`_pair_lanes`) or, with BF16, bf16 e2m1 * 2^-126 (`_v2_pair_bits`). Written by
    `python benchmarks/unpack_layouts.py --triton` (each line's comment: its instructions)."""
    # BEGIN generated recipes
    if LAYOUT == 2 and not BF16 and J == 0:  # 3
        return _moved(words, 0, 0x20072007, 0, -0x71FF7200, 0, 0, 0x204)
    elif LAYOUT == 2 and not BF16 and J == 1:  # 3
        return _moved(words, 0, 0x10381038, 0, -0x71FF7200, 0, 0, 0x48)
    elif LAYOUT == 2 and not BF16 and J == 2:  # 3
        return _moved(words, 0, -0x7E3F7E40, 0, -0x71FF7200, 0, 0, 9)
    elif LAYOUT == 2 and not BF16 and J == 3:  # 3
        return _moved(words, 0, 0xE000E00, 1, -0x7FFF8000, 0, 0, 0)
    elif LAYOUT == 2 and BF16 and J == 0:  # 3
        return _moved(words, 0, 0x20072007, 0, -0x7E3F7E40, 0, 0, 0x44)
    elif LAYOUT == 2 and BF16 and J == 1:  # 2
        return _moved(words, 3, -0x7E3F7E40, 0, 0, 0, 0, 0)
    elif LAYOUT == 2 and BF16 and J == 2:  # 1
        return _moved(words, 0, -0x7E3F7E40, 0, 0, 0, 0, 0)
    elif LAYOUT == 2 and BF16 and J == 3:  # 4
        return _moved(words, 1, -0x7FFF8000, 29, 0x1C001C0, 0, 0, 0)
    elif LAYOUT == 3 and not BF16 and J == 0:  # 4
        return _moved(words, 8, -0x7FFF8000, 11, 0xE000E00, 0, 0, 0)
    elif LAYOUT == 3 and not BF16 and J == 1:  # 3
        return _moved(words, 0, 0x110A110A, 0, -0x71FF7200, 0, 0, 0x248)
    elif LAYOUT == 3 and not BF16 and J == 2:  # 3
        return _moved(words, 0, 0xE000E00, 29, -0x7FFF8000, 0, 0, 0)
    elif LAYOUT == 3 and not BF16 and J == 3:  # 3
        return _moved(words, 0, 0x20702070, 0, -0x71FF7200, 0, 0, 36)
    elif LAYOUT == 3 and BF16 and J == 0:  # 2
        return _moved(words, 8, -0x7E3F7E40, 0, 0, 0, 0, 0)
    elif LAYOUT == 3 and BF16 and J == 1:  # 3
        return _moved(words, 0, 0x110A110A, 0, -0x7E3F7E40, 0, 0, 0x49)
    elif LAYOUT == 3 and BF16 and J == 2:  # 2
        return _moved(words, 29, -0x7E3F7E40, 0, 0, 0, 0, 0)
    elif LAYOUT == 3 and BF16 and J == 3:  # 2
        return _moved(words, 2, -0x7E3F7E40, 0, 0, 0, 0, 0)
    elif LAYOUT == 4 and not BF16 and J == 0:  # 6
        return _moved(words, 6, 0x6000600, 11, 0x8000800, 14, -0x7FFF8000, 0)
    elif LAYOUT == 4 and not BF16 and J == 1:  # 3
        return _moved(words, 0, 0xE000E00, 29, -0x7FFF8000, 0, 0, 0)
    elif LAYOUT == 4 and not BF16 and J == 2:  # 4
        return _moved(words, 10, -0x7FFF8000, 13, 0xE000E00, 0, 0, 0)
    elif LAYOUT == 4 and not BF16 and J == 3:  # 3
        return _moved(words, 0, -0x7E3F7E40, 0, -0x71FF7200, 0, 0, 9)
    elif LAYOUT == 4 and BF16 and J == 0:  # 3
        return _moved(words, 0, 0x1B001B, 0, -0x7E3F7E40, 0, 0, 0x4108)
    elif LAYOUT == 4 and BF16 and J == 1:  # 2
        return _moved(words, 29, -0x7E3F7E40, 0, 0, 0, 0, 0)
    elif LAYOUT == 4 and BF16 and J == 2:  # 2
        return _moved(words, 10, -0x7E3F7E40, 0, 0, 0, 0, 0)
    elif LAYOUT == 4 and BF16 and J == 3:  # 1
        return _moved(words, 0, -0x7E3F7E40, 0, 0, 0, 0, 0)
    else:
        tl.static_assert(False, "no recipe for this LAYOUT")
    # END generated recipes


@triton.jit
def _split4(t):
    """[..., 4] -> its four slices along the last axis (register moves when one thread holds
    all four, as after a 16-byte load)."""
    a, b = tl.split(tl.reshape(t, t.shape[:-1] + [2, 2]))
    a0, a1 = tl.split(a)
    b0, b1 = tl.split(b)
    return a0, b0, a1, b1


@triton.jit
def _group_dot(words, x_ptrs, x_mask, PLANE: tl.constexpr, LAYOUT: tl.constexpr):
    """Dot products over whole scale groups -> fp32 [...].

    words [..., GB, 4] int32: the 4 words (32 codes) of each of GB scale groups; x_ptrs
    [..., GB * 4]: the matching words of x's pair plane 0 (planes 1..3 follow at PLANE words). Plane p
    holds, per word q, x[8q + p] and x[8q + p + 4] as fp16 lanes, matching `_pair_lanes`.
    All 16 products of a group go into one packed-fp16 accumulator (16 HFMA2 on the GPU)."""
    p0, p1, p2, p3 = _x_planes(x_ptrs, x_mask, PLANE)
    return _planes_dot(words, p0, p1, p2, p3, LAYOUT)


@triton.jit
def _x_planes(x_ptrs, x_mask, PLANE: tl.constexpr):
    """The x words of a step's four pair planes (see _group_dot): four loads, unmasked where
    x_mask is None (a whole step, see WHOLE_STEPS)."""
    if x_mask is None:
        p0 = tl.load(x_ptrs)
        p1 = tl.load(x_ptrs + PLANE)
        p2 = tl.load(x_ptrs + 2 * PLANE)
        p3 = tl.load(x_ptrs + 3 * PLANE)
    else:
        p0 = tl.load(x_ptrs, mask=x_mask, other=0)
        p1 = tl.load(x_ptrs + PLANE, mask=x_mask, other=0)
        p2 = tl.load(x_ptrs + 2 * PLANE, mask=x_mask, other=0)
        p3 = tl.load(x_ptrs + 3 * PLANE, mask=x_mask, other=0)
    return p0, p1, p2, p3


@triton.jit
def _planes_dot(words, p0, p1, p2, p3, LAYOUT: tl.constexpr):
    """_group_dot with the four planes' x words already loaded."""
    w0, w1, w2, w3 = _split4(words)
    acc = tl.zeros_like(w0)
    acc = _plane_products(acc, w0, w1, w2, w3, p0, 0, LAYOUT)
    acc = _plane_products(acc, w0, w1, w2, w3, p1, 1, LAYOUT)
    acc = _plane_products(acc, w0, w1, w2, w3, p2, 2, LAYOUT)
    acc = _plane_products(acc, w0, w1, w2, w3, p3, 3, LAYOUT)
    return _fp16_lane(acc, False) + _fp16_lane(acc, True)


@triton.jit
def _plane_products(acc, w0, w1, w2, w3, x_words, PAIR: tl.constexpr, LAYOUT: tl.constexpr):
    """acc + the products of codes PAIR and PAIR + 4 of each word with plane PAIR's x words."""
    x_words = tl.reshape(x_words, x_words.shape[:-1] + [x_words.shape[-1] // 4, 4])
    x0, x1, x2, x3 = _split4(x_words)
    acc = _hfma2(_pair_lanes(w0, PAIR, LAYOUT), x0, acc)
    acc = _hfma2(_pair_lanes(w1, PAIR, LAYOUT), x1, acc)
    acc = _hfma2(_pair_lanes(w2, PAIR, LAYOUT), x2, acc)
    return _hfma2(_pair_lanes(w3, PAIR, LAYOUT), x3, acc)


@triton.jit
def _pair_plane_index(k, N: tl.constexpr):
    """fp16 position of element k of an N-vector stored as pair planes ([4, N/8] words)."""
    return (k % 4) * (N // 4) + (k // 8) * 2 + (k % 8) // 4


@triton.jit(do_not_specialize=["scale_step"])
def _fp16_gate_up_kernel(
    x_ptr,  # [T, H/2] int32: x * 2^e_t as fp16 pair planes [T, 4, H/8]
    x_unscale_ptr,  # [T] fp32: 2^-e_t
    ids_ptr,  # [P] int32
    words_ptr,  # [E, 2I, H/32, 4] int32
    scales_ptr,  # [E, 2I, H/32] uint8
    bias_ptr,  # [E, 2I]
    act_ptr,  # [P, INTER] fp16 out: act * 2^ACT_EXP as pair planes
    part_ptr,  # [SPLIT_K, P, 2, INTER] fp32 partial sums (SPLIT_K > 1)
    limit,
    alpha,
    # 1, passed at run time and not specialized: scale loads that look non-contiguous get their
    # layout from the order their dims are written in (see SCALES_T)
    scale_step,
    H: tl.constexpr,
    INTER: tl.constexpr,
    TOP_K: tl.constexpr,
    ACT_EXP: tl.constexpr,
    BLOCK_PAIRS: tl.constexpr,
    GROUPS_PER_STEP: tl.constexpr,
    SPLIT_K: tl.constexpr,
    NUM_STAGES: tl.constexpr = 0,  # 0: register double buffer; >= 2: tl.range pipelining
    PDL: tl.constexpr = False,  # see gossamer/kernels/pdl.py
    LAYOUT: tl.constexpr = 0,  # LAYOUT_HF or LAYOUT_FP16_LANES (the words' bit layout)
    logits_ptr=None,  # [T, E] router logits (EARLY)
    logits_stride=0,
    E: tl.constexpr = 1,  # experts (EARLY)
    E_P2: tl.constexpr = 1,
    K_P2: tl.constexpr = 1,
    EARLY: tl.constexpr = 0,  # 1: the expert from the logits and the first step's words, before
    # the PDL wait (see the comment at the wait)
    ROUTE: tl.constexpr = 0,  # 1: the expert from the logits after the wait, no routing kernel
    SCALES_T: tl.constexpr = 0,  # scales through transposed pointers (DECODE_FP16_GATE_UP)
    WHOLE_STEPS: tl.constexpr = 0,  # > 0: whole steps unmasked, unrolled this much (see
    # WHOLE_STEPS; only where `_whole_steps` allows it)
    PREFETCH_L2: tl.constexpr = 0,  # 1: the program's scale rows into L2 as it starts; 2: its
    # words too (SPLIT_K 1; see GATE_UP_PREFETCH_L2)
    SCALE_LINES: tl.constexpr = 1,  # 128-byte lines of the program's scale rows, a power of two
    WORD_LINES: tl.constexpr = 1,  # the same for its words
):
    G: tl.constexpr = H // 32
    # from a gate row's words / scales to its up row's
    UP_WORDS: tl.constexpr = G * 4
    UP_SCALES: tl.constexpr = G
    pid_n = tl.program_id(0)
    pair = tl.program_id(1)
    pid_k = tl.program_id(2)
    g_lo = pid_k * G // SPLIT_K
    g_hi = (pid_k + 1) * G // SPLIT_K
    token = pair // TOP_K
    j = pid_n * BLOCK_PAIRS + tl.arange(0, BLOCK_PAIRS)
    j_ok = j < INTER
    # Words of a step run along one axis (GROUPS_PER_STEP * 4 of them per row), so that a warp's
    # 16-byte loads cover whole runs of a row; they are regrouped per scale group in registers.
    kw = tl.arange(0, GROUPS_PER_STEP * 4)
    gate_rows = 2 * j
    step = tl.arange(0, GROUPS_PER_STEP)
    w_mask = j_ok[:, None] & (g_lo * 4 + kw < g_hi * 4)[None, :]
    if EARLY:
        # NOTE: under PDL this runs while the routing kernel (the previous launch) may still run.
        # The logits come from the launch before it (the router GEMV), which had finished before
        # the routing let this kernel start (in its own wait), so they are final; read through L2
        # (.cg), where that kernel's writes are. The same top-k as the routing's gives the same
        # expert, and its first weights are on their way before the wait.
        expert = _routed_expert(logits_ptr + token * logits_stride, pair % TOP_K, E, E_P2, TOP_K,
                                K_P2).to(tl.int64)  # fmt: skip
        gate_w_ptrs, gate_s_ptrs = _gate_up_ptrs(words_ptr, scales_ptr, expert, gate_rows, g_lo,
                                                 kw, step, scale_step, INTER, G)  # fmt: skip
        if NUM_STAGES == 0:
            next_gate = tl.load(gate_w_ptrs, mask=w_mask)
            next_up = tl.load(gate_w_ptrs + G * 4, mask=w_mask)
            if not _INTERPRETED:  # the first step's scales to L2 (the step loads them itself)
                ends = tl.minimum(g_lo + tl.arange(0, 2) * (GROUPS_PER_STEP - 1), g_hi - 1)
                rows = tl.minimum(gate_rows, 2 * INTER - 2)  # a gate row and its up row
                first = scales_ptr + expert * (2 * INTER * G) + rows[:, None] * G + ends[None, :]
                pdl.prefetch_l2(first)
                pdl.prefetch_l2(first + G)
    pdl.wait(PDL)
    if not EARLY:
        if ROUTE:  # the logits come from the launch just before (the router GEMV)
            expert = _routed_expert(logits_ptr + token * logits_stride, pair % TOP_K, E, E_P2,
                                    TOP_K, K_P2).to(tl.int64)  # fmt: skip
        else:
            expert = tl.load(ids_ptr + pair).to(tl.int64)
        gate_w_ptrs, gate_s_ptrs = _gate_up_ptrs(words_ptr, scales_ptr, expert, gate_rows, g_lo,
                                                 kw, step, scale_step, INTER, G)  # fmt: skip
    if PREFETCH_L2 and not _INTERPRETED:
        row0 = 2 * pid_n * BLOCK_PAIRS
        lines = _row_block_lines(expert, row0, 2 * BLOCK_PAIRS, 2 * INTER, G, 128, SCALE_LINES)
        pdl.prefetch_l2(scales_ptr + lines)
        if PREFETCH_L2 == 2:  # words are int32: 32 to a line
            lines = _row_block_lines(expert, row0, 2 * BLOCK_PAIRS, 2 * INTER, G * 4, 32,
                                     WORD_LINES)  # fmt: skip
            pdl.prefetch_l2(words_ptr + lines)
    x_ptrs = x_ptr + token * (H // 2) + (g_lo * 4 + kw)[None, :]  # [1, GB * 4], pair plane 0
    tile: tl.constexpr = (BLOCK_PAIRS, GROUPS_PER_STEP, 4)

    acc_gate = tl.zeros([BLOCK_PAIRS, GROUPS_PER_STEP], tl.float32)
    acc_up = tl.zeros([BLOCK_PAIRS, GROUPS_PER_STEP], tl.float32)
    if WHOLE_STEPS:
        if not EARLY:
            next_gate = tl.load(gate_w_ptrs)
            next_up = tl.load(gate_w_ptrs + UP_WORDS)
        acc_gate, acc_up = _gate_up_whole_steps(
            acc_gate, acc_up, next_gate, next_up, gate_w_ptrs, gate_s_ptrs, x_ptrs, j_ok, kw, step,
            scale_step, G, UP_WORDS, UP_SCALES, H // 8, GROUPS_PER_STEP, LAYOUT, SCALES_T,
            WHOLE_STEPS,
        )  # fmt: skip
    elif NUM_STAGES == 0:
        # Register double buffer: the weights of step g+1 are loaded before step g is computed.
        if not EARLY:
            next_gate = tl.load(gate_w_ptrs, mask=w_mask)
            next_up = tl.load(gate_w_ptrs + UP_WORDS, mask=w_mask)
        for g0 in range(g_lo, g_hi, GROUPS_PER_STEP):
            gate_words = tl.reshape(next_gate, tile)
            up_words = tl.reshape(next_up, tile)
            d = (g0 - g_lo + GROUPS_PER_STEP) * 4
            w_mask = j_ok[:, None] & ((g0 + GROUPS_PER_STEP) * 4 + kw < g_hi * 4)[None, :]
            next_gate = tl.load(gate_w_ptrs + d, mask=w_mask)
            next_up = tl.load(gate_w_ptrs + UP_WORDS + d, mask=w_mask)
            acc_gate, acc_up = _gate_up_step(
                acc_gate, acc_up, gate_words, up_words, gate_s_ptrs, x_ptrs, g0, g_lo, g_hi,
                j_ok, kw, step, scale_step, UP_SCALES, H // 8, LAYOUT, SCALES_T,
            )  # fmt: skip
    else:
        # Triton's pipeliner keeps NUM_STAGES - 1 steps of weights in flight (async copies through
        # shared memory): more bytes in flight per SM than the register double buffer.
        for g0 in tl.range(g_lo, g_hi, GROUPS_PER_STEP, num_stages=NUM_STAGES):
            w_mask = j_ok[:, None] & (g0 * 4 + kw < g_hi * 4)[None, :]
            d = (g0 - g_lo) * 4
            gate_words = tl.reshape(tl.load(gate_w_ptrs + d, mask=w_mask), tile)
            up_words = tl.reshape(tl.load(gate_w_ptrs + UP_WORDS + d, mask=w_mask), tile)
            acc_gate, acc_up = _gate_up_step(
                acc_gate, acc_up, gate_words, up_words, gate_s_ptrs, x_ptrs, g0, g_lo, g_hi,
                j_ok, kw, step, scale_step, UP_SCALES, H // 8, LAYOUT, SCALES_T,
            )  # fmt: skip

    x_unscale = tl.load(x_unscale_ptr + token)
    gate = tl.sum(acc_gate, axis=1) * x_unscale
    up = tl.sum(acc_up, axis=1) * x_unscale
    if SPLIT_K == 1:
        bias_row = bias_ptr + expert * (2 * INTER) + gate_rows
        gate += tl.load(bias_row, mask=j_ok, other=0.0).to(tl.float32)
        up += tl.load(bias_row + 1, mask=j_ok, other=0.0).to(tl.float32)
        _store_act(act_ptr, pair, j, j_ok, _swiglu(gate, up, limit, alpha), INTER, ACT_EXP)
    else:  # bias and SwiGLU wait for the sum over the K chunks (_fp16_swiglu_kernel)
        part = part_ptr + ((pid_k * tl.num_programs(1) + pair) * 2) * INTER + j
        tl.store(part, gate, mask=j_ok)
        tl.store(part + INTER, up, mask=j_ok)


@triton.jit
def _gate_up_whole_steps(
    acc_gate, acc_up, next_gate, next_up, gate_w_ptrs, gate_s_ptrs, x_ptrs, j_ok, kw, step,
    scale_step, G: tl.constexpr, UP_WORDS: tl.constexpr, UP_SCALES: tl.constexpr,
    PLANE: tl.constexpr, GB: tl.constexpr, LAYOUT: tl.constexpr, SCALES_T: tl.constexpr,
    UNROLL: tl.constexpr,
):  # fmt: skip
    """gate_up's register double buffer over a whole row (SPLIT_K 1) of real rows (WHOLE_STEPS),
    its whole steps' loads unmasked, only the last, partial step's masked. next_gate / next_up:
    the first step's words, loaded by the caller."""
    tile: tl.constexpr = (next_gate.shape[0], GB, 4)
    G_FULL: tl.constexpr = G // GB * GB
    for g0 in tl.range(0, G_FULL - GB, GB, loop_unroll_factor=UNROLL):
        gate_words, up_words = tl.reshape(next_gate, tile), tl.reshape(next_up, tile)
        next_gate = tl.load(gate_w_ptrs + (g0 + GB) * 4)
        next_up = tl.load(gate_w_ptrs + UP_WORDS + (g0 + GB) * 4)
        acc_gate, acc_up = _gate_up_step(
            acc_gate, acc_up, gate_words, up_words, gate_s_ptrs, x_ptrs, g0, 0, G, j_ok, kw, step,
            scale_step, UP_SCALES, PLANE, LAYOUT, SCALES_T, False,
        )  # fmt: skip
    gate_words, up_words = tl.reshape(next_gate, tile), tl.reshape(next_up, tile)
    if G_FULL < G:  # the partial step's words, before the last whole step's products
        w_mask = (G_FULL * 4 + kw < G * 4)[None, :]
        next_gate = tl.load(gate_w_ptrs + G_FULL * 4, mask=w_mask)
        next_up = tl.load(gate_w_ptrs + UP_WORDS + G_FULL * 4, mask=w_mask)
    acc_gate, acc_up = _gate_up_step(
        acc_gate, acc_up, gate_words, up_words, gate_s_ptrs, x_ptrs, G_FULL - GB, 0, G, j_ok, kw,
        step, scale_step, UP_SCALES, PLANE, LAYOUT, SCALES_T, False,
    )  # fmt: skip
    if G_FULL < G:
        acc_gate, acc_up = _gate_up_step(
            acc_gate, acc_up, tl.reshape(next_gate, tile), tl.reshape(next_up, tile),
            gate_s_ptrs, x_ptrs, G_FULL, 0, G, j_ok, kw, step, scale_step, UP_SCALES, PLANE,
            LAYOUT, SCALES_T,
        )  # fmt: skip
    return acc_gate, acc_up


@triton.jit
def _gate_up_ptrs(words_ptr, scales_ptr, expert, gate_rows, g_lo, kw, step, scale_step,
                  INTER: tl.constexpr, G: tl.constexpr):  # fmt: skip
    """gate_up's word pointers [BP, GB * 4] and scale pointers [BP, GB] of its first step (the
    gate rows; each up row follows its gate row)."""
    w_ptrs = (
        words_ptr
        + expert * (2 * INTER * G * 4)
        + gate_rows[:, None] * (G * 4)
        + (g_lo * 4 + kw)[None, :]
    )
    s_ptrs = (
        scales_ptr
        + expert * (2 * INTER * G)
        + gate_rows[:, None] * G
        + (g_lo + step)[None, :] * scale_step
    )
    return w_ptrs, s_ptrs


@triton.jit
def _row_block_lines(expert, first_row, num_rows: tl.constexpr, rows_per_expert: tl.constexpr,
                     row_len: tl.constexpr, per_line: tl.constexpr, LINES: tl.constexpr):  # fmt: skip
    """Element offsets, one in each 128-byte line (per_line elements) that rows [first_row,
    first_row + num_rows) of `expert` touch (rows of row_len elements, clamped to the expert's
    rows_per_expert): LINES >= cdiv(num_rows * row_len, per_line) + 1 of them, the last ones
    repeating the block's last element (a line asked twice costs nothing more)."""
    base = expert * (rows_per_expert * row_len)
    last_row = tl.minimum(first_row + num_rows, rows_per_expert) - 1
    lines = base + first_row * row_len + tl.arange(0, LINES) * per_line
    return tl.minimum(lines, base + last_row * row_len + row_len - 1)


def row_block_lines(rows: int, row_bytes: int) -> int:
    """_row_block_lines' LINES for a block of `rows` rows of row_bytes bytes: enough lines for any
    alignment of the block, rounded up to a power of two."""
    return triton.next_power_of_2(triton.cdiv(rows * row_bytes, 128) + 1)


def prefetch_lines(config: dict[str, int], groups: int) -> dict[str, int]:
    """gate_up's SCALE_LINES and WORD_LINES for `config` over rows of `groups` scale groups
    ({} without PREFETCH_L2): a program's 2 * BLOCK_PAIRS rows of scales (a byte a group) and of
    words (16 bytes a group)."""
    if not config.get("PREFETCH_L2", 0):
        return {}
    rows = 2 * config["BLOCK_PAIRS"]
    return {"SCALE_LINES": row_block_lines(rows, groups),
            "WORD_LINES": row_block_lines(rows, groups * 16)}  # fmt: skip


@triton.jit
def _gate_up_step(
    acc_gate, acc_up, gate_words, up_words, gate_s_ptrs, x_ptrs, g0, g_lo, g_hi, j_ok, kw, step,
    scale_step, UP_SCALES: tl.constexpr, PLANE: tl.constexpr, LAYOUT: tl.constexpr,
    SCALES_T: tl.constexpr, MASKED: tl.constexpr = True,
):  # fmt: skip
    """One step of GROUPS_PER_STEP scale groups: scales, x, and the packed-fp16 dot products.
    UP_SCALES: from a gate row's scales to its up row's.
    SCALES_T: the scales loaded through transposed pointers, see DECODE_FP16_GATE_UP.
    MASKED False: a whole step of real rows (WHOLE_STEPS), its loads without predicates."""
    s_mask = None
    if MASKED:
        s_mask = j_ok[:, None] & (g0 + step < g_hi)[None, :]
    s_ptrs = gate_s_ptrs + (g0 - g_lo) * scale_step
    gate_scale = _step_scales(s_ptrs, s_mask, SCALES_T)
    up_scale = _step_scales(s_ptrs + UP_SCALES, s_mask, SCALES_T)
    xp = x_ptrs + (g0 - g_lo) * 4
    x_mask = None
    if MASKED:
        x_mask = (g0 * 4 + kw < g_hi * 4)[None, :]
    acc_gate += _group_dot(gate_words, xp, x_mask, PLANE, LAYOUT) * gate_scale
    acc_up += _group_dot(up_words, xp, x_mask, PLANE, LAYOUT) * up_scale
    return acc_gate, acc_up


@triton.jit
def _step_scales(s_ptrs, s_mask, TRANSPOSED: tl.constexpr):
    """The e8m0 scales at s_ptrs as fp32, masked unless s_mask is None; TRANSPOSED: loaded
    through transposed pointers (gate_up's SCALES_T)."""
    if TRANSPOSED:
        if s_mask is None:
            raw = tl.trans(tl.load(tl.trans(s_ptrs)))
        else:
            raw = tl.trans(tl.load(tl.trans(s_ptrs), mask=tl.trans(s_mask)))
    elif s_mask is None:
        raw = tl.load(s_ptrs)
    else:
        raw = tl.load(s_ptrs, mask=s_mask)
    return _e8m0_scale(raw)


@triton.jit
def _store_act(act_ptr, pair, j, j_ok, act, INTER: tl.constexpr, ACT_EXP: tl.constexpr):
    """Store act * 2^ACT_EXP as fp16 at element j of the pair's row, as pair planes."""
    scaled = (act * (2.0**ACT_EXP)).to(tl.float16)
    tl.store(act_ptr + pair * INTER + _pair_plane_index(j, INTER), scaled, mask=j_ok)


@triton.jit
def _fp16_swiglu_kernel(
    part_ptr,  # [SPLIT_K, P, 2, INTER] fp32
    ids_ptr,  # [P] int32
    bias_ptr,  # [E, 2I]
    act_ptr,  # [P, INTER] fp16 out
    limit,
    alpha,
    INTER: tl.constexpr,
    ACT_EXP: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,  # see gossamer/kernels/pdl.py
):
    """Split-K gate_up epilogue: sum the chunks, add the bias, clamped SwiGLU, fp16 store."""
    pid_n = tl.program_id(0)
    pair = tl.program_id(1)
    num_pairs = tl.num_programs(1)
    pdl.wait(PDL)
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    j = pid_n * BLOCK + tl.arange(0, BLOCK)
    j_ok = j < INTER
    bias_row = bias_ptr + expert * (2 * INTER) + 2 * j
    gate = tl.load(bias_row, mask=j_ok, other=0.0).to(tl.float32)
    up = tl.load(bias_row + 1, mask=j_ok, other=0.0).to(tl.float32)
    for k in tl.static_range(SPLIT_K):
        part = part_ptr + ((k * num_pairs + pair) * 2) * INTER + j
        gate += tl.load(part, mask=j_ok, other=0.0)
        up += tl.load(part + INTER, mask=j_ok, other=0.0)
    _store_act(act_ptr, pair, j, j_ok, _swiglu(gate, up, limit, alpha), INTER, ACT_EXP)


@triton.jit(do_not_specialize=["scale_step"])
def _fp16_down_kernel(
    act_ptr,  # [P, INTER/2] int32 (fp16 pairs, act * 2^ACT_EXP)
    ids_ptr,  # [P] int32
    route_w_ptr,  # [P] fp32
    words_ptr,  # [E, H, INTER/32, 4] int32
    scales_ptr,  # [E, H, INTER/32] uint8
    bias_ptr,  # [E, H]
    out_ptr,  # [T, H] out; with SPLIT_K > 1: [SPLIT_K, T, H] fp32 partials
    scale_step,  # 1: see _fp16_gate_up_kernel
    H: tl.constexpr,
    INTER: tl.constexpr,
    TOP_K: tl.constexpr,
    K_P2: tl.constexpr,
    ACT_EXP: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    GROUPS_PER_STEP: tl.constexpr,
    SPLIT_K: tl.constexpr,
    NUM_STAGES: tl.constexpr = 0,  # as in _fp16_gate_up_kernel
    PDL: tl.constexpr = False,  # see gossamer/kernels/pdl.py
    PREFETCH_WORDS: tl.constexpr = 128,  # per (row, expert), sent to L2 before the PDL wait
    LAYOUT: tl.constexpr = 0,  # as in _fp16_gate_up_kernel
    AHEAD: tl.constexpr = 0,  # with NUM_STAGES 0: 2 loads scales and activations a step ahead
    EARLY: tl.constexpr = 0,  # with AHEAD 2: 1 loads the first step's words and scales before
    # the PDL wait (into registers; the L2 prefetch above covers PREFETCH_WORDS either way)
    ROUTE: tl.constexpr = 0,  # 1: ids and weights from the router logits (no routing kernel)
    logits_ptr=None,  # [T, E] router logits (ROUTE)
    logits_stride=0,
    E: tl.constexpr = 1,  # experts (ROUTE)
    E_P2: tl.constexpr = 1,
    WHOLE_STEPS: tl.constexpr = 0,  # as in _fp16_gate_up_kernel (with AHEAD 2)
):
    G: tl.constexpr = INTER // 32
    pid_n = tl.program_id(0)
    token = tl.program_id(1)
    pid_k = tl.program_id(2)
    g_lo = pid_k * G // SPLIT_K
    g_hi = (pid_k + 1) * G // SPLIT_K
    slot = tl.arange(0, K_P2)
    slot_ok = slot < TOP_K
    pair = token * TOP_K + slot
    # NOTE: under PDL this runs while gate_up (the previous kernel) may still run, but the routing
    # that wrote ids and route_w came before gate_up, and gate_up's programs let this kernel start
    # only after their own wait, i.e. after routing finished: ids are final. They are read through
    # L2 (.cg), where that kernel's writes are. So the first weight tile below is requested before
    # this kernel's wait, and its trip from HBM overlaps gate_up's tail.
    # With ROUTE the same holds for the logits: the router GEMV ran before gate_up.
    if ROUTE:
        e_idx = tl.arange(0, E_P2)
        logits = tl.load(logits_ptr + token * logits_stride + e_idx, mask=e_idx < E,
                         other=float("-inf"), cache_modifier=".cg").to(tl.float32)  # fmt: skip
        top_ids, route_w = _top_k_weights(logits, e_idx, E, E_P2, TOP_K, K_P2)
        expert = top_ids.to(tl.int64)
    else:
        expert = tl.load(ids_ptr + pair, mask=slot_ok, other=0, cache_modifier=".cg").to(tl.int64)
        route_w = tl.load(route_w_ptr + pair, mask=slot_ok, other=0.0, cache_modifier=".cg")

    row = pid_n * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_ok = row < H
    kw = tl.arange(0, GROUPS_PER_STEP * 4)  # words of a step along one axis, as in gate_up
    w_ptrs = (
        words_ptr
        + expert[None, :, None] * (H * G * 4)
        + row[:, None, None] * (G * 4)
        + (g_lo * 4 + kw)[None, None, :]
    )  # [BN, K, GB * 4]
    step = tl.arange(0, GROUPS_PER_STEP)
    s_ptrs = (
        scales_ptr
        + expert[None, :, None] * (H * G)
        + row[:, None, None] * G
        + (g_lo + step)[None, None, :] * scale_step
    )  # [BN, K, GB]
    x_ptrs = act_ptr + pair[None, :, None] * (INTER // 2) + (g_lo * 4 + kw)[None, None, :]
    row_slot_ok = row_ok[:, None] & slot_ok[None, :]
    tile: tl.constexpr = (BLOCK_ROWS, K_P2, GROUPS_PER_STEP, 4)

    acc = tl.zeros([BLOCK_ROWS, K_P2, GROUPS_PER_STEP], tl.float32)
    if PDL:
        # the first PREFETCH_WORDS words of each (row, expert) run (clamped to the chunk's end)
        line = tl.arange(0, PREFETCH_WORDS // 32) * 32  # 32 words: one 128-byte line
        run = words_ptr + expert[None, :, None] * (H * G * 4) + row[:, None, None] * (G * 4)
        pdl.prefetch_l2(run + g_lo * 4 + tl.minimum(line, (g_hi - g_lo) * 4 - 1)[None, None, :])
    if EARLY:  # the first step's weight words and scales too (weights: no kernel writes them)
        first = _down_loads(w_ptrs, s_ptrs, g_lo, g_lo, g_hi, row_slot_ok, kw, step, scale_step)
    pdl.wait(PDL)  # the activations come from gate_up
    if NUM_STAGES == 0 and AHEAD == 2:
        if not EARLY:
            first = _down_loads(w_ptrs, s_ptrs, g_lo, g_lo, g_hi, row_slot_ok, kw, step,
                                scale_step)  # fmt: skip
        if WHOLE_STEPS:
            acc = _down_whole_steps(acc, first, w_ptrs, s_ptrs, x_ptrs, kw, step, scale_step, G,
                                    INTER // 8, GROUPS_PER_STEP, LAYOUT, WHOLE_STEPS)  # fmt: skip
        else:
            acc = _down_ahead(acc, first, w_ptrs, s_ptrs, x_ptrs, g_lo, g_hi, row_slot_ok, slot_ok,
                              kw, step, scale_step, INTER // 8, GROUPS_PER_STEP, LAYOUT)  # fmt: skip
    elif NUM_STAGES == 0:  # register double buffer, as in _fp16_gate_up_kernel
        w_mask = row_slot_ok[:, :, None] & (g_lo * 4 + kw < g_hi * 4)[None, None, :]
        next_words = tl.load(w_ptrs, mask=w_mask)
        for g0 in range(g_lo, g_hi, GROUPS_PER_STEP):
            words = tl.reshape(next_words, tile)
            d = (g0 - g_lo + GROUPS_PER_STEP) * 4
            w_mask = (
                row_slot_ok[:, :, None]
                & ((g0 + GROUPS_PER_STEP) * 4 + kw < g_hi * 4)[None, None, :]
            )
            next_words = tl.load(w_ptrs + d, mask=w_mask)
            acc = _down_step(acc, words, s_ptrs, x_ptrs, g0, g_lo, g_hi, row_slot_ok, slot_ok, kw,
                             step, scale_step, INTER // 8, LAYOUT)  # fmt: skip
    else:  # tl.range pipelining, as in _fp16_gate_up_kernel
        for g0 in tl.range(g_lo, g_hi, GROUPS_PER_STEP, num_stages=NUM_STAGES):
            w_mask = row_slot_ok[:, :, None] & (g0 * 4 + kw < g_hi * 4)[None, None, :]
            words = tl.reshape(tl.load(w_ptrs + (g0 - g_lo) * 4, mask=w_mask), tile)
            acc = _down_step(acc, words, s_ptrs, x_ptrs, g0, g_lo, g_hi, row_slot_ok, slot_ok, kw,
                             step, scale_step, INTER // 8, LAYOUT)  # fmt: skip

    bias = tl.load(bias_ptr + expert[None, :] * H + row[:, None], mask=row_slot_ok, other=0.0)
    per_slot = tl.sum(acc, axis=2) * (2.0**-ACT_EXP)
    if SPLIT_K == 1:
        out = tl.sum((per_slot + bias.to(tl.float32)) * route_w[None, :], axis=1)
        tl.store(out_ptr + token * H + row, out.to(out_ptr.dtype.element_ty), mask=row_ok)
    else:  # chunk 0 adds the biases; _split_sum_kernel adds the chunks up
        per_slot += tl.where(pid_k == 0, bias.to(tl.float32), 0.0)
        out = tl.sum(per_slot * route_w[None, :], axis=1)
        tl.store(out_ptr + (pid_k * tl.num_programs(1) + token) * H + row, out, mask=row_ok)


@triton.jit
def _down_step(
    acc, words, s_ptrs, x_ptrs, g0, g_lo, g_hi, row_slot_ok, slot_ok, kw, step, scale_step,
    PLANE: tl.constexpr, LAYOUT: tl.constexpr,
):  # fmt: skip
    """One step of the down GEMV: scales, the activations and the packed-fp16 dot products."""
    s_mask = row_slot_ok[:, :, None] & (g0 + step < g_hi)[None, None, :]
    scale = _e8m0_scale(tl.load(s_ptrs + (g0 - g_lo) * scale_step, mask=s_mask))
    x_mask = slot_ok[None, :, None] & (g0 * 4 + kw < g_hi * 4)[None, None, :]
    return acc + _group_dot(words, x_ptrs + (g0 - g_lo) * 4, x_mask, PLANE, LAYOUT) * scale


# Loading a step ahead (down's AHEAD 2): in the register double buffer only the weight words of
# step g+1 are in flight while step g computes, so each step still waits for its scales (from HBM)
# and its activation words (from L2) before its products: two dependent trips per step, six steps
# per 120b row. AHEAD 2 issues both with the next step's words, at the cost of registers. Measured
# on the H200 (DECODE_FP16_DOWN's comment) it pays for down only (-1.6 us per layer): down's four
# per-slot activation vectors were the exposed part. gate_up lost with it (+2.4..2.8 us; layout
# shuffles and more registers in its SASS), and with its scales alone (+0.2..0.4), so gate_up has
# no such option.


@triton.jit
def _down_ahead(
    acc, first, w_ptrs, s_ptrs, x_ptrs, g_lo, g_hi, row_slot_ok, slot_ok, kw, step, scale_step,
    PLANE: tl.constexpr, GB: tl.constexpr, LAYOUT: tl.constexpr,
):  # fmt: skip
    """down's K loop with every load of a step (words, scales, activations) issued one step early:
    the same products in the same order as the register double buffer. `first`: the first step's
    (words, raw scales), loaded by the caller."""
    tile: tl.constexpr = (w_ptrs.shape[0], w_ptrs.shape[1], GB, 4)
    words, raw_scales = first
    p0, p1, p2, p3 = _down_x(x_ptrs, g_lo, g_lo, g_hi, slot_ok, kw, PLANE)
    for g0 in range(g_lo, g_hi, GB):
        step_words, scale = tl.reshape(words, tile), _e8m0_scale(raw_scales)
        words, raw_scales = _down_loads(w_ptrs, s_ptrs, g0 + GB, g_lo, g_hi, row_slot_ok, kw,
                                        step, scale_step)  # fmt: skip
        n0, n1, n2, n3 = _down_x(x_ptrs, g0 + GB, g_lo, g_hi, slot_ok, kw, PLANE)
        acc += _planes_dot(step_words, p0, p1, p2, p3, LAYOUT) * scale
        p0, p1, p2, p3 = n0, n1, n2, n3
    return acc


@triton.jit
def _down_whole_steps(
    acc, first, w_ptrs, s_ptrs, x_ptrs, kw, step, scale_step, G: tl.constexpr,
    PLANE: tl.constexpr, GB: tl.constexpr, LAYOUT: tl.constexpr, UNROLL: tl.constexpr,
):  # fmt: skip
    """`_down_ahead` over a whole row (SPLIT_K 1) of real rows and slots (WHOLE_STEPS): the same
    products in the same order, the whole steps' loads unmasked, only the last, partial step's
    masked."""
    tile: tl.constexpr = (w_ptrs.shape[0], w_ptrs.shape[1], GB, 4)
    G_FULL: tl.constexpr = G // GB * GB
    words, raw_scales = first
    p0, p1, p2, p3 = _x_planes(x_ptrs, None, PLANE)
    for g0 in tl.range(0, G_FULL - GB, GB, loop_unroll_factor=UNROLL):
        step_words, scale = tl.reshape(words, tile), _e8m0_scale(raw_scales)
        words = tl.load(w_ptrs + (g0 + GB) * 4)
        raw_scales = tl.load(s_ptrs + (g0 + GB) * scale_step)
        n0, n1, n2, n3 = _x_planes(x_ptrs + (g0 + GB) * 4, None, PLANE)
        acc += _planes_dot(step_words, p0, p1, p2, p3, LAYOUT) * scale
        p0, p1, p2, p3 = n0, n1, n2, n3
    step_words, scale = tl.reshape(words, tile), _e8m0_scale(raw_scales)
    if G_FULL < G:  # the partial step's loads, before the last whole step's products
        real = tl.full(w_ptrs.shape[:2], 1, tl.int1)
        words, raw_scales = _down_loads(w_ptrs, s_ptrs, G_FULL, 0, G, real, kw, step, scale_step)
        n0, n1, n2, n3 = _x_planes(x_ptrs + G_FULL * 4, (G_FULL * 4 + kw < G * 4)[None, None, :],
                                   PLANE)  # fmt: skip
    acc += _planes_dot(step_words, p0, p1, p2, p3, LAYOUT) * scale
    if G_FULL < G:
        acc += _planes_dot(tl.reshape(words, tile), n0, n1, n2, n3, LAYOUT) * _e8m0_scale(
            raw_scales
        )
    return acc


@triton.jit
def _down_loads(w_ptrs, s_ptrs, g0, g_lo, g_hi, row_slot_ok, kw, step, scale_step):
    """down's words and raw scales of the step at group g0 (none past g_hi)."""
    w_mask = row_slot_ok[:, :, None] & (g0 * 4 + kw < g_hi * 4)[None, None, :]
    s_mask = row_slot_ok[:, :, None] & (g0 + step < g_hi)[None, None, :]
    words = tl.load(w_ptrs + (g0 - g_lo) * 4, mask=w_mask)
    return words, tl.load(s_ptrs + (g0 - g_lo) * scale_step, mask=s_mask)


@triton.jit
def _down_x(x_ptrs, g0, g_lo, g_hi, slot_ok, kw, PLANE: tl.constexpr):
    """down's activation words (four pair planes) of the step at group g0."""
    x_mask = slot_ok[None, :, None] & (g0 * 4 + kw < g_hi * 4)[None, None, :]
    return _x_planes(x_ptrs + (g0 - g_lo) * 4, x_mask, PLANE)


@triton.jit
def _split_sum_kernel(
    part_ptr,  # [SPLIT_K, N] fp32
    out_ptr,  # [N] out
    N,
    SPLIT_K: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,  # see gossamer/kernels/pdl.py
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    pdl.wait(PDL)
    ok = offs < N
    total = tl.zeros([BLOCK], tl.float32)
    for k in tl.static_range(SPLIT_K):
        total += tl.load(part_ptr + k * N + offs, mask=ok, other=0.0)
    tl.store(out_ptr + offs, total.to(out_ptr.dtype.element_ty), mask=ok)


def act_exponent(swiglu_limit: float) -> int:
    """The fixed power of two that scales SwiGLU outputs into fp16: |act| <= limit * (limit + 1)
    (the gate clamped above, the up clamped to +-limit), scaled to at most 60,000 (< 65,504)."""
    return math.floor(math.log2(60000.0 / (swiglu_limit * (swiglu_limit + 1.0))))


def moe_mxfp4_decode_fp16(
    x: torch.Tensor,
    router_logits: torch.Tensor,
    experts: ExpertWeights,
    top_k: int,
    swiglu_limit: float,
    swiglu_alpha: float,
    gate_up_config: dict[str, int] | None = None,
    down_config: dict[str, int] | None = None,
) -> torch.Tensor:
    """The GEMV path with packed-fp16 products (see the section comment). The configs override
    DECODE_FP16_GATE_UP / DECODE_FP16_DOWN; SPLIT_K in them splits the K loop across programs."""
    num_tokens, hidden, num_experts, inter = _check(x, router_logits, experts, top_k)
    if not experts.is_mxfp4:
        raise MoEShapeError("the GEMV path needs MXFP4 experts; use moe_mxfp4_grouped for dense")
    if not 0.0 < swiglu_limit < 1e4:
        raise MoEShapeError(f"the fp16 GEMV needs a finite SwiGLU limit, got {swiglu_limit}")
    gu = dict(gate_up_config or DECODE_FP16_GATE_UP)
    dn = dict(down_config or DECODE_FP16_DOWN)
    _check_fp16_configs(gu, dn)
    x = x.contiguous()
    out = torch.empty_like(x)
    if num_tokens == 0:
        return out
    ids, route_w, x_h, x_unscale = route_fp16(router_logits, top_k, x)
    _fp16_experts(x_h, x_unscale, ids, route_w, experts, out, inter, top_k, swiglu_limit,
                  swiglu_alpha, gu, dn, router_logits)  # fmt: skip
    return out


def _check_fp16_configs(gate_up: dict, down: dict) -> None:
    """SPLIT_K >= 1 for both GEMVs; AHEAD only for down, 0 or 2 (see DECODE_FP16_DOWN), and
    down's EARLY only with AHEAD 2."""
    for name, config in (("gate_up", gate_up), ("down", down)):
        if not isinstance(config.get("SPLIT_K"), int) or config["SPLIT_K"] < 1:
            raise MoEShapeError(f"{name} config needs SPLIT_K >= 1, got {config.get('SPLIT_K')!r}")
    if "AHEAD" in gate_up:
        raise MoEShapeError("gate_up has no AHEAD (measured slower; see DECODE_FP16_DOWN)")
    if gate_up.get("PREFETCH_L2", 0) not in (0, 1, 2) or (
        gate_up.get("PREFETCH_L2", 0) and gate_up["SPLIT_K"] != 1
    ):
        raise MoEShapeError(f"gate_up's PREFETCH_L2 is 0, 1 or 2, with SPLIT_K 1: {gate_up!r}")
    if down.get("AHEAD", 0) not in (0, 2):
        raise MoEShapeError(f"down's AHEAD is 0 or 2, got {down['AHEAD']!r}")
    if down.get("EARLY", 0) and down.get("AHEAD", 0) != 2:
        raise MoEShapeError(f"down's EARLY needs AHEAD 2, got {down!r}")


def _fp16_experts(
    x_h: torch.Tensor,
    x_unscale: torch.Tensor,
    ids: torch.Tensor,
    route_w: torch.Tensor,
    experts: ExpertWeights,
    out: torch.Tensor,
    inter: int,
    top_k: int,
    swiglu_limit: float,
    swiglu_alpha: float,
    gate_up_config: dict[str, int] | None = None,
    down_config: dict[str, int] | None = None,
    router_logits: torch.Tensor | None = None,
) -> None:
    """The fp16 GEMV path after the routing: gate_up (+ SwiGLU), then down into out.
    `router_logits`: the logits the routing kernel (the launch just before) read, for gate_up's
    EARLY; without them gate_up reads the routing's ids after its wait. With ids None no routing
    kernel ran: both GEMVs route from `router_logits` themselves (see `moe_from_logits`)."""
    act_exp = act_exponent(swiglu_limit)
    route = ids is None
    gate_up = gate_up_config or DECODE_FP16_GATE_UP
    down = down_config or DECODE_FP16_DOWN
    if route and (router_logits is None or gate_up["SPLIT_K"] != 1):
        raise MoEShapeError("routing in the GEMVs needs the logits and an unsplit gate_up")
    act = _fp16_gate_up(x_h, x_unscale, ids, experts, inter, top_k, swiglu_limit, swiglu_alpha,
                        act_exp, gate_up, router_logits, route)  # fmt: skip
    _fp16_down(act, ids, route_w, experts, out, inter, top_k, act_exp, down,
               router_logits if route else None)  # fmt: skip


def _logits_args(router_logits: torch.Tensor, top_k: int) -> dict:
    """The GEMV kernels' arguments for finding experts from the router logits themselves."""
    num_experts = router_logits.shape[1]
    return dict(logits_ptr=router_logits, logits_stride=router_logits.stride(0), E=num_experts,
                E_P2=triton.next_power_of_2(num_experts),
                K_P2=triton.next_power_of_2(top_k))  # fmt: skip


def _whole_steps(config: dict[str, int], real_rows: bool, groups: int) -> int:
    """config's WHOLE_STEPS where the GEMV can take it (its register double buffer over a whole
    row of real rows, with at least one whole step), else 0."""
    usable = (
        real_rows
        and config["SPLIT_K"] == 1
        and config.get("NUM_STAGES", 0) == 0
        and groups >= config["GROUPS_PER_STEP"]
    )
    return config.get("WHOLE_STEPS", 0) if usable else 0


# Epilogue kernels (split-K sums) take this many elements per program.
_SPLIT_EPILOGUE_BLOCK = 1024

# The batch-1 gate_up GEMV reading a copy of gate_up's words and scales packed by program (a
# program's 32 rows x 16 groups a step one 8 KB run instead of 32 pieces 1,440 bytes apart) was
# slower in the graph (H200, session 16, fusion_ab.py, fed: 20b 1.459 -> 1.469 ms, 120b 2.089 ->
# 2.107) and cost a second copy of gate_up (~41 GB on 120b); removed in session 36.


def _fp16_gate_up(
    x_h: torch.Tensor,
    x_unscale: torch.Tensor,
    ids: torch.Tensor,
    experts: ExpertWeights,
    inter: int,
    top_k: int,
    swiglu_limit: float,
    swiglu_alpha: float,
    act_exp: int,
    config: dict[str, int],
    router_logits: torch.Tensor | None = None,
    route: bool = False,
) -> torch.Tensor:
    """gate_up GEMV (+ the split-K epilogue) -> act [P, I] fp16, pair planes, * 2^act_exp.
    With config EARLY 1 and `router_logits` (which the routing read), each program finds its
    expert from the logits before the PDL wait; without logits EARLY is ignored. With `route`
    (no routing kernel ran; ids is None) it finds it there after the wait."""
    num_pairs = ids.shape[0] if not route else router_logits.shape[0] * top_k
    split_k = config["SPLIT_K"]
    early = {}
    if route:  # EARLY would read the logits before the router GEMV (the launch before) ended
        early = dict(_logits_args(router_logits, top_k), ROUTE=1)
        config = config | {"EARLY": 0} | ROUTING_GEMV_CHANGES
    elif config.get("EARLY", 0) and router_logits is not None:
        early = _logits_args(router_logits, top_k)
    else:
        config = config | {"EARLY": 0}
    whole = inter % config["BLOCK_PAIRS"] == 0
    config = config | {"WHOLE_STEPS": _whole_steps(config, whole, x_h.shape[1] // MXFP4_GROUP)}
    config = config | prefetch_lines(config, x_h.shape[1] // MXFP4_GROUP)
    act = torch.empty(num_pairs, inter, dtype=torch.float16, device=x_h.device)
    part = None
    if split_k > 1:
        part = torch.empty(split_k, num_pairs, 2, inter, dtype=torch.float32, device=x_h.device)
    _fp16_gate_up_kernel[(triton.cdiv(inter, config["BLOCK_PAIRS"]), num_pairs, split_k)](
        x_h.view(torch.int32),
        x_unscale,
        ids if ids is not None else x_unscale,
        experts.gate_up_blocks.view(torch.int32),
        experts.gate_up_scales,
        experts.gate_up_bias.contiguous(),
        act,
        part,
        float(swiglu_limit),
        float(swiglu_alpha),
        1,
        H=x_h.shape[1],
        INTER=inter,
        TOP_K=top_k,
        ACT_EXP=act_exp,
        LAYOUT=layout_code(experts),
        **early,
        **config,
        **pdl.launch_options(x_h.device),
    )
    if split_k > 1:
        block = min(_SPLIT_EPILOGUE_BLOCK, triton.next_power_of_2(inter))
        _fp16_swiglu_kernel[(triton.cdiv(inter, block), num_pairs)](
            part,
            ids,
            experts.gate_up_bias.contiguous(),
            act,
            float(swiglu_limit),
            float(swiglu_alpha),
            INTER=inter,
            ACT_EXP=act_exp,
            SPLIT_K=split_k,
            BLOCK=block,
            num_warps=4,
            **pdl.launch_options(act.device),
        )
    return act


def _fp16_down(
    act: torch.Tensor,
    ids: torch.Tensor,
    route_w: torch.Tensor,
    experts: ExpertWeights,
    out: torch.Tensor,
    inter: int,
    top_k: int,
    act_exp: int,
    config: dict[str, int],
    router_logits: torch.Tensor | None = None,
) -> None:
    """down GEMV (+ the split-K sum): out[t] = sum over slots of weight * (W act + bias). With
    `router_logits` (ids and route_w None: no routing kernel ran) each program routes itself."""
    num_tokens, hidden = out.shape
    split_k = config["SPLIT_K"]
    route = {}
    if router_logits is not None:
        route = dict(_logits_args(router_logits, top_k), ROUTE=1)
        ids = route_w = act  # placeholders, never read
        config = config | {k: v for k, v in ROUTING_GEMV_CHANGES.items() if k in config}
    k_p2 = triton.next_power_of_2(top_k)
    whole = hidden % config["BLOCK_ROWS"] == 0 and k_p2 == top_k and config.get("AHEAD", 0) == 2
    config = config | {"WHOLE_STEPS": _whole_steps(config, whole, inter // MXFP4_GROUP)}
    target = out
    if split_k > 1:
        target = torch.empty(split_k, num_tokens, hidden, dtype=torch.float32, device=out.device)
    _fp16_down_kernel[(triton.cdiv(hidden, config["BLOCK_ROWS"]), num_tokens, split_k)](
        act.view(torch.int32),
        ids,
        route_w,
        experts.down_blocks.view(torch.int32),
        experts.down_scales,
        experts.down_bias.contiguous(),
        target,
        1,
        H=hidden,
        INTER=inter,
        TOP_K=top_k,
        ACT_EXP=act_exp,
        LAYOUT=layout_code(experts),
        **config,
        **(route or {"K_P2": k_p2}),
        **pdl.launch_options(out.device),
    )
    if split_k > 1:
        size = num_tokens * hidden
        block = min(_SPLIT_EPILOGUE_BLOCK, triton.next_power_of_2(size))
        _split_sum_kernel[(triton.cdiv(size, block),)](
            target,
            out,
            size,
            SPLIT_K=split_k,
            BLOCK=block,
            num_warps=4,
            **pdl.launch_options(out.device),
        )


# ----------------------------------------------------------------------------------------------
# Grouped path: tokens sorted by expert, tensor-core tiles
# ----------------------------------------------------------------------------------------------


@triton.jit
def _expert_tile(
    pid_m,
    counts_ptr,
    offsets_ptr,
    tile_ends_ptr,
    E: tl.constexpr,
    E_P2: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """Which expert owns M-tile pid_m, and the sorted rows [row_start, row_end) of that tile.
    expert == E means the tile is past the last real one (the grid is an upper bound)."""
    e_idx = tl.arange(0, E_P2)
    tile_ends = tl.load(tile_ends_ptr + e_idx, mask=e_idx < E, other=2**30)
    expert = tl.sum((tile_ends <= pid_m).to(tl.int32), axis=0)
    safe = tl.minimum(expert, E - 1)
    count = tl.load(counts_ptr + safe)
    first_tile = tl.load(tile_ends_ptr + safe) - (count + BLOCK_M - 1) // BLOCK_M
    expert_start = tl.load(offsets_ptr + safe)
    row_start = expert_start + (pid_m - first_tile) * BLOCK_M
    return expert, row_start, expert_start + count


@triton.jit
def _weight_tile(
    w_ptr,
    scales_ptr,
    expert,
    rows,  # [R] rows of this expert's [N, K] matrix
    rows_ok,
    k0,  # first K element of the step
    N: tl.constexpr,
    K: tl.constexpr,
    GROUPS_PER_STEP: tl.constexpr,
    IS_MXFP4: tl.constexpr,
    LANES: tl.constexpr,
):
    """[R, GROUPS_PER_STEP * 32] tile of W[expert, rows, k0:k0+BK] (zeros past K); MXFP4 tiles are
    in the paired K order, times 2^-64 with bf16 lanes."""
    BK: tl.constexpr = GROUPS_PER_STEP * 32
    if IS_MXFP4:
        G: tl.constexpr = K // 32
        group = k0 // 32 + tl.arange(0, GROUPS_PER_STEP)
        word = tl.arange(0, 4)
        group_ok = group < G
        words = tl.load(
            w_ptr
            + expert * (N * G * 4)
            + rows[:, None, None] * (G * 4)
            + group[None, :, None] * 4
            + word[None, None, :],
            mask=rows_ok[:, None, None] & group_ok[None, :, None],
            other=0,
        )
        scales = tl.load(
            scales_ptr + expert * (N * G) + rows[:, None] * G + group[None, :],
            mask=rows_ok[:, None] & group_ok[None, :],
            other=0,
        )
        return _dequant_words(words, scales, LANES)
    else:
        k = k0 + tl.arange(0, BK)
        return tl.load(
            w_ptr + expert * (N * K) + rows[:, None] * K + k[None, :],
            mask=rows_ok[:, None] & (k < K)[None, :],
            other=0.0,
        )


@triton.jit
def _accumulate(acc, a, w, DOT_BF16: tl.constexpr, SWAP_AB: tl.constexpr):
    """acc + a [M, K] @ w [N, K].T in fp32: bf16 tensor cores, or exact fp32 (no tf32).

    SWAP_AB keeps acc transposed ([N, M] = w @ a.T): with few rows per expert the weight tile is
    the M >= 64 operand (one wgmma per warpgroup) and the 16..32 rows the small N operand."""
    if DOT_BF16:
        a = a.to(tl.bfloat16)
        w = w.to(tl.bfloat16)
        if SWAP_AB:
            return tl.dot(w, tl.trans(a), acc)
        else:
            return tl.dot(a, tl.trans(w), acc)
    else:
        a = a.to(tl.float32)
        w = w.to(tl.float32)
        if SWAP_AB:
            return tl.dot(w, tl.trans(a), acc, input_precision="ieee")
        else:
            return tl.dot(a, tl.trans(w), acc, input_precision="ieee")


@triton.jit
def _zeros_acc(M: tl.constexpr, N: tl.constexpr, SWAP_AB: tl.constexpr):
    if SWAP_AB:
        return tl.zeros([N, M], tl.float32)
    else:
        return tl.zeros([M, N], tl.float32)


@triton.jit
def _unrescale(acc, IS_MXFP4: tl.constexpr, LANES: tl.constexpr):
    """Undo the 2^-64 of bf16-lane weight tiles (exact: a power of two in fp32)."""
    if IS_MXFP4 and LANES != 0:
        return acc * _LANE_RESCALE
    else:
        return acc


@triton.jit
def _unswap(acc, SWAP_AB: tl.constexpr):
    if SWAP_AB:
        return tl.trans(acc)
    else:
        return acc


@triton.jit
def _grouped_gate_up_kernel(
    x_ptr,  # [T, H], in the paired K order when IS_MXFP4
    sorted_pairs_ptr,  # [P] int32: pair index (token * TOP_K + slot) in expert order
    counts_ptr,  # [E] int32 pairs per expert
    offsets_ptr,  # [E] int32 first sorted row of each expert
    tile_ends_ptr,  # [E] int32 cumulative M-tile count
    w_ptr,  # [E, 2I, H/32, 4] int32 (packed rows as words), or dense [E, 2I, H]
    scales_ptr,  # [E, 2I, H/32] uint8 (ignored when dense)
    bias_ptr,  # [E, 2I]
    act_ptr,  # [P, INTER] out, sorted rows (paired K order when IS_MXFP4)
    limit,
    alpha,
    H: tl.constexpr,
    INTER: tl.constexpr,
    E: tl.constexpr,
    E_P2: tl.constexpr,
    TOP_K: tl.constexpr,
    IS_MXFP4: tl.constexpr,
    DOT_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_PAIRS: tl.constexpr,
    GROUPS_PER_STEP: tl.constexpr,
    SWAP_AB: tl.constexpr,
    LANES: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    expert, row_start, row_end = _expert_tile(
        pid_m, counts_ptr, offsets_ptr, tile_ends_ptr, E, E_P2, BLOCK_M
    )
    if expert >= E:
        return
    expert = expert.to(tl.int64)
    sorted_row = row_start + tl.arange(0, BLOCK_M)
    sorted_ok = sorted_row < row_end
    token = tl.load(sorted_pairs_ptr + sorted_row, mask=sorted_ok, other=0) // TOP_K
    j = pid_n * BLOCK_PAIRS + tl.arange(0, BLOCK_PAIRS)
    j_ok = j < INTER
    BK: tl.constexpr = GROUPS_PER_STEP * 32

    acc_gate = _zeros_acc(BLOCK_M, BLOCK_PAIRS, SWAP_AB)
    acc_up = _zeros_acc(BLOCK_M, BLOCK_PAIRS, SWAP_AB)
    for k0 in range(0, H, BK):
        k = k0 + tl.arange(0, BK)
        a = tl.load(
            x_ptr + token[:, None].to(tl.int64) * H + k[None, :],
            mask=sorted_ok[:, None] & (k < H)[None, :],
            other=0.0,
        )
        w_gate = _weight_tile(
            w_ptr,
            scales_ptr,
            expert,
            2 * j,
            j_ok,
            k0,
            2 * INTER,
            H,
            GROUPS_PER_STEP,
            IS_MXFP4,
            LANES,
        )
        acc_gate = _accumulate(acc_gate, a, w_gate, DOT_BF16, SWAP_AB)
        w_up = _weight_tile(
            w_ptr,
            scales_ptr,
            expert,
            2 * j + 1,
            j_ok,
            k0,
            2 * INTER,
            H,
            GROUPS_PER_STEP,
            IS_MXFP4,
            LANES,
        )
        acc_up = _accumulate(acc_up, a, w_up, DOT_BF16, SWAP_AB)

    bias_row = bias_ptr + expert * (2 * INTER) + 2 * j
    acc_gate = _unrescale(_unswap(acc_gate, SWAP_AB), IS_MXFP4, LANES)
    acc_up = _unrescale(_unswap(acc_up, SWAP_AB), IS_MXFP4, LANES)
    gate = acc_gate + tl.load(bias_row, mask=j_ok, other=0.0).to(tl.float32)[None, :]
    up = acc_up + tl.load(bias_row + 1, mask=j_ok, other=0.0).to(tl.float32)[None, :]
    act = _swiglu(gate, up, limit, alpha)
    if IS_MXFP4:  # the down kernel's weights come in the paired K order
        act_col = _paired_index(j)
    else:
        act_col = j
    tl.store(
        act_ptr + sorted_row[:, None].to(tl.int64) * INTER + act_col[None, :],
        act.to(act_ptr.dtype.element_ty),
        mask=sorted_ok[:, None] & j_ok[None, :],
    )


@triton.jit
def _grouped_down_kernel(
    act_ptr,  # [P, INTER] sorted rows (paired K order when IS_MXFP4)
    sorted_pairs_ptr,  # [P] int32
    route_w_ptr,  # [P] fp32, by pair index
    counts_ptr,
    offsets_ptr,
    tile_ends_ptr,
    w_ptr,  # [E, H, INTER/32, 4] int32 (packed rows as words), or dense [E, H, INTER]
    scales_ptr,  # [E, H, INTER/32] uint8
    bias_ptr,  # [E, H]
    y_ptr,  # [P, H] fp32 out, by pair index: routing weight * expert output
    H: tl.constexpr,
    INTER: tl.constexpr,
    E: tl.constexpr,
    E_P2: tl.constexpr,
    IS_MXFP4: tl.constexpr,
    DOT_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
    GROUPS_PER_STEP: tl.constexpr,
    SWAP_AB: tl.constexpr,
    LANES: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    expert, row_start, row_end = _expert_tile(
        pid_m, counts_ptr, offsets_ptr, tile_ends_ptr, E, E_P2, BLOCK_M
    )
    if expert >= E:
        return
    expert = expert.to(tl.int64)
    sorted_row = row_start + tl.arange(0, BLOCK_M)
    sorted_ok = sorted_row < row_end
    pair = tl.load(sorted_pairs_ptr + sorted_row, mask=sorted_ok, other=0)
    col = pid_n * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    col_ok = col < H
    BK: tl.constexpr = GROUPS_PER_STEP * 32

    acc = _zeros_acc(BLOCK_M, BLOCK_COLS, SWAP_AB)
    for k0 in range(0, INTER, BK):
        k = k0 + tl.arange(0, BK)
        a = tl.load(
            act_ptr + sorted_row[:, None].to(tl.int64) * INTER + k[None, :],
            mask=sorted_ok[:, None] & (k < INTER)[None, :],
            other=0.0,
        )
        w = _weight_tile(
            w_ptr, scales_ptr, expert, col, col_ok, k0, H, INTER, GROUPS_PER_STEP, IS_MXFP4, LANES
        )
        acc = _accumulate(acc, a, w, DOT_BF16, SWAP_AB)

    acc = _unrescale(_unswap(acc, SWAP_AB), IS_MXFP4, LANES)
    bias = tl.load(bias_ptr + expert * H + col, mask=col_ok, other=0.0).to(tl.float32)
    route_w = tl.load(route_w_ptr + pair, mask=sorted_ok, other=0.0)
    y = (acc + bias[None, :]) * route_w[:, None]
    tl.store(
        y_ptr + pair[:, None].to(tl.int64) * H + col[None, :],
        y,
        mask=sorted_ok[:, None] & col_ok[None, :],
    )


def _block_m(num_pairs: int, num_experts: int) -> int:
    """Rows per M-tile: about the mean pairs per expert, 16..32 (16 is the smallest mma tile).

    NOTE: capped at SWAP_AB_MAX_BLOCK_M: Triton 3.6 (the H200 image) fails to compile the
    unswapped 64-row tile ("Illegal shared layout"; seen on gpt-oss-20b shapes, 2026-12-02)."""
    mean = triton.cdiv(num_pairs, num_experts)
    return max(16, min(SWAP_AB_MAX_BLOCK_M, triton.next_power_of_2(mean)))


def _v2_block_m(num_pairs: int, num_experts: int) -> int:
    """v2's rows per M-tile: twice the mean pairs per expert, V2_MIN_BLOCK_M..32 rows, and
    V2_MAX_BLOCK_M from V2_TALL_MIN_PAIRS pairs an expert (their configs: `v2_configs`)."""
    mean = triton.cdiv(num_pairs, num_experts)
    cap = V2_MAX_BLOCK_M if mean >= V2_TALL_MIN_PAIRS else min(V2_MAX_BLOCK_M, 32)
    return max(V2_MIN_BLOCK_M, min(cap, 2 * triton.next_power_of_2(mean)))


def _expert_schedule(
    ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Graph-safe sort of the (token, slot) pairs by expert (no host syncs, shape-sized outputs).

    Returns sorted_pairs [P] int32, counts [E], offsets [E] (first sorted row of each expert) and
    tile_ends [E] (cumulative number of BLOCK_M tiles), all int32."""
    sorted_pairs = torch.argsort(ids, stable=True).to(torch.int32)
    counts = torch.zeros(num_experts, dtype=torch.int32, device=ids.device)
    counts.scatter_add_(0, ids.long(), torch.ones_like(ids))
    ends = torch.cumsum(counts, 0, dtype=torch.int32)
    tile_ends = torch.cumsum(torch.div(counts + block_m - 1, block_m, rounding_mode="floor"), 0)
    return sorted_pairs, counts, ends - counts, tile_ends.to(torch.int32)


def moe_mxfp4_grouped(
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
    """The grouped-GEMM path: every chosen expert is read once per call. Handles MXFP4 and dense.
    block_m and the configs override the defaults (benchmark sweeps, tests)."""
    num_tokens, hidden, num_experts, inter = _check(x, router_logits, experts, top_k)
    if experts.is_mxfp4:
        _require_published_layout(experts, "the v1 grouped kernels")
    x = x.contiguous()
    if num_tokens == 0:
        return torch.empty_like(x)
    num_pairs = num_tokens * top_k
    block_m = block_m or _block_m(num_pairs, num_experts)
    mxfp4 = experts.is_mxfp4
    if mxfp4:  # the weight tiles come in the paired K order, so x does too
        ids, route_w, x_dot = route(router_logits, top_k, x, x_layout="paired")
    else:
        ids, route_w, _ = route(router_logits, top_k)
        x_dot = x
    sorted_pairs, counts, offsets, tile_ends = _expert_schedule(ids, num_experts, block_m)
    # Every non-empty expert wastes less than one tile, hence this bound on the real M-tiles.
    max_m_tiles = triton.cdiv(num_pairs, block_m) + min(num_experts, num_pairs)
    # bf16 activations use bf16 tensor cores (as the reference computes in bf16); fp16 and fp32
    # compute in exact fp32 (fp16 cannot hold every dequantized weight's range).
    dot_bf16 = x.dtype == torch.bfloat16
    act_dtype = torch.bfloat16 if dot_bf16 else torch.float32
    if mxfp4:  # packed rows read as int32 words of 8 codes
        gate_up_w = experts.gate_up_blocks.view(torch.int32)
        down_w = experts.down_blocks.view(torch.int32)
    else:
        gate_up_w = experts.gate_up_dense.contiguous()
        down_w = experts.down_dense.contiguous()

    act = torch.empty(num_pairs, inter, dtype=act_dtype, device=x.device)  # sorted order
    swap_ab = {"SWAP_AB": block_m <= SWAP_AB_MAX_BLOCK_M}
    gu = swap_ab | (gate_up_config or GROUPED_GATE_UP)
    _grouped_gate_up_kernel[(triton.cdiv(inter, gu["BLOCK_PAIRS"]), max_m_tiles)](
        x_dot,
        sorted_pairs,
        counts,
        offsets,
        tile_ends,
        gate_up_w,
        experts.gate_up_scales if mxfp4 else gate_up_w,
        experts.gate_up_bias.contiguous(),
        act,
        float(swiglu_limit),
        float(swiglu_alpha),
        H=hidden,
        INTER=inter,
        E=num_experts,
        TOP_K=top_k,
        IS_MXFP4=mxfp4,
        E_P2=triton.next_power_of_2(num_experts),
        DOT_BF16=dot_bf16,
        BLOCK_M=block_m,
        LANES=_lanes(),
        **gu,
    )
    y = torch.empty(num_pairs, hidden, dtype=torch.float32, device=x.device)  # by pair index
    dn = swap_ab | (down_config or GROUPED_DOWN)
    _grouped_down_kernel[(triton.cdiv(hidden, dn["BLOCK_COLS"]), max_m_tiles)](
        act,
        sorted_pairs,
        route_w,
        counts,
        offsets,
        tile_ends,
        down_w,
        experts.down_scales if mxfp4 else down_w,
        experts.down_bias.contiguous(),
        y,
        H=hidden,
        INTER=inter,
        E=num_experts,
        IS_MXFP4=mxfp4,
        E_P2=triton.next_power_of_2(num_experts),
        DOT_BF16=dot_bf16,
        BLOCK_M=block_m,
        LANES=_lanes(),
        **dn,
    )
    return y.view(num_tokens, top_k, hidden).sum(dim=1).to(x.dtype)


# ----------------------------------------------------------------------------------------------
# Grouped path v2: weights dequantized straight into the tensor cores' register layout
# ----------------------------------------------------------------------------------------------
# The v1 kernels above issue about 5.0 SASS instructions per weight (sm_90, triton 3.6): besides
# the unpack, each dequantized tile takes a layout conversion through shared memory before the
# wgmma, and each thread reads words it uses only a quarter of. v2 (GROUPED_V2) picks the K order
# so that the thread that loads a scale group's 16 bytes is the one whose wgmma registers need
# all 32 of its weights, and picks the tile's row order so that the loads already have the
# accumulator's row layout (SASS counts: see the configs below):
#   * wgmma's register operand (m64nNk16, 16-bit): lane l of warp w holds rows 16w + l/4 + {0, 8}
#     of each 64 and, in every run of 8 K positions, positions 2 (l % 4) + {0, 1}.
#   * A step covers GB = GROUPS_PER_STEP scale groups (a multiple of 4). The lane with l % 4 = GL
#     loads groups 4 GH + GL (GH < GB/4) of its rows, 4 words each, and K position
#         p = h + 2 GL + 8 wi + 32 (j % 2) + 64 (j // 2) + 128 GH
#     holds code j + 4h of word wi of group 4 GH + GL: the codes j and j + 4 that one shift pair
#     turns into a bf16x2 word sit in one register's two K positions. Activations are stored in
#     this order (`_v2_position`), rows padded to whole steps; the pad is never read (the last
#     partial step is peeled off the loop and masked).
#   * Rows: tiles are loaded as [REP, 2, NW, 8] (registers, registers, warps, lanes/4), which is
#     the accumulator's row order 16 NW rep + 16 w + 8 d + l/4. gate_up puts the gate row 2j at
#     d = 0 and the up row 2j + 1 at d = 1, so one thread holds both halves of its SwiGLUs.
#   * Unpack (`_v2_pair_bits`): per bf16x2 word one AND isolates two nibbles, one multiply by
#     2^a + 2^b writes two disjoint copies (magnitude bits to 6..8, sign to 15), one AND keeps
#     those: 3 integer instructions per 2 weights, then v1's packed bf16 fma by 2^(s-65).
# The CPU interpreter runs the same bit layout with the fma emulated in fp32 (LANES_BF16_EMULATED).
# Measured on the H200 (2026-12-02, decode_speed.py, 120b dummy weights, 1k context): batch 64
# 51.1 -> 30.3 ms per step, batch 256 -> 38.6 ms (65.2 ms the session before with v1); 1k-token
# prefill 100.9 -> 62.4 ms. Dense experts stay on v1.
GROUPED_V2 = True  # moe_mxfp4 sends MXFP4 batches above the GEMV limit to v2
# Configs: REP * 8 * num_warps intermediate pairs (gate_up) or REP * 16 * num_warps output
# columns (down) per program; GROUPS_PER_STEP a multiple of 4; NUM_STAGES for tl.range;
# SCALE_PREFETCH loads the next step's scales a step ahead (they are too narrow for async copies).
# SASS compiled offline (sm_90, triton 3.6, as benchmarks/sass_counts.py does), instructions per
# weight in the main loop of gate_up / down at BLOCK_M 16: these configs 3.20 / 3.22; without
# SCALE_PREFETCH 3.07 / 3.14; REP 2 3.54 / 3.55; at BLOCK_M 32 3.28 / 3.33 (v1: 4.98 / 4.75).
# REP 4 takes 255 registers (2 programs per SM). SCALE_PREFETCH is on because a synchronous scale
# load would wait for HBM once per step.
# Swept on the H200 (2026-12-03, benchmarks/moe_grouped_sweep.py, 120b shapes, 36 configs per
# kernel at 64 tokens): the smallest tiles on 8 warps won for both kernels (more programs per SM
# hide the unpack's latency better than REP 4's fewer instructions per weight): one layer 757.7 ->
# 674.0 us at 64 tokens, 887 -> 767 at 256, 1526 -> 1295 at 1024 (floors 345, 399, 401 us).
GROUPED_V2_GATE_UP = {"REP": 1, "GROUPS_PER_STEP": 4, "NUM_STAGES": 3, "SCALE_PREFETCH": 1,
                      "num_warps": 8}  # fmt: skip
GROUPED_V2_DOWN = {"REP": 1, "GROUPS_PER_STEP": 4, "NUM_STAGES": 3, "SCALE_PREFETCH": 1,
                   "num_warps": 8}  # fmt: skip
# v2's M-tile: twice the mean pairs an expert, 8..64 rows (`_v2_block_m`), V2_TILE_CHANGES[rows]
# applied to both kernels' configs unless a config is passed. 8 rows compile the MMA column tile
# to mma.sync instead of wgmma: 3.88 instructions a weight offline against 4.17 (sm_90 SASS,
# triton 3.6, the default tile).
# Measured on the H200 (2026-12-04, moe_grouped_sweep.py --block-ms 8,16,32 --warps 4,8, one 120b
# layer, us), the chosen tile first, the previous default (16 rows or the mean, 8 warps) second:
# 64 tokens 589 / 658, 128 689 / 739, 256 742 / 783, 512 952 / 1074, 1024 1380 (unchanged).
# Steps of 8 scale groups at 8 rows: swept on an H100 (2026-12-05, moe_grouped_sweep.py
# --block-m 8, one 120b layer): 735 -> 630 us at 64 tokens, 547 -> 473 at 32, 845 -> 732 at 128
# (16 groups, or 8 warps, or 4-5 stages were slower; at 256 tokens and 16 rows 8 groups were
# not faster).
V2_MIN_BLOCK_M = 8
# v2 always keeps the accumulator transposed (the tokens are the MMA's N side), so 64- and 128-row
# tiles compile (sm_90, triton 3.6, offline: 4.36 / 4.53 instructions a weight at 64 rows on 8
# warps, 4.73 / 4.78 at 128, against 4.20 / 4.31 at 32), and each dequantized weight serves 2x /
# 4x the tokens of a prefill chunk. Without the per-step wait (_V2_ASYNC_MMA_MAX_M) they computed
# wrong results on the GPU (H100, session 22: relative error inf at 64 rows, 0.82 at 128); with
# it they are right (session 23, H100, moe_grouped_sweep.py --block-ms 64,128,32, one 120b
# layer): 8192 tokens 6833 us at 32 rows, 4927 at 64, 6202 at 128; 1024 tokens 1429 / 1583 /
# 3697. Where they start to pay (session 24, H100, --block-ms 32,64): 2048 tokens (64 pairs an
# expert) 2113 -> 1959 us, 4096 tokens 3587 -> 2899. In the model: an 8k-prompt TTFT of 120b
# 318.8 -> 255.9 ms, a 1k prompt of 20b (128 pairs an expert) 29.3 -> 25.2 ms. So 64 rows from
# V2_TALL_MIN_PAIRS = 64 pairs an expert (120b from 2048 tokens in a step, 20b from 512).
V2_MAX_BLOCK_M = 64
V2_TALL_MIN_PAIRS = int(os.environ.get("GOSSAMER_V2_TALL_MIN_PAIRS", "64"))
# Registers a thread for the 8-row tile (ptxas's .maxnreg, a launch option; unset: 88 in the
# mma.sync order with triton 3.6, so 5 programs of 4 warps fit an SM). Offline (sm_90): 80 ->
# 6 programs, 72 -> 7, 64 -> 8 (32 warps against 20), the loop 409 -> 422 / 426 / 430
# instructions, spills only outside it. The tile issues about half the instructions it could
# (H100, session 29: 596 us a layer where its ~280M warp instructions need ~270 at full issue),
# so more warps to hide latency looked worth a try; they are slower (H100, session 30, one
# 120b layer at 64 tokens: 593.9 us at 88 registers, 605 / 646 / 671 at 80 / 72 / 64;
# `moe_grouped_sweep --ab-maxnreg` repeats it).
V2_TILE_CHANGES = {
    8: {"num_warps": 4, "GROUPS_PER_STEP": 8},
    16: {"num_warps": 4},
    32: {"num_warps": 8},
    64: {"num_warps": 8},
    128: {"num_warps": 8},
}


def v2_configs(block_m: int) -> tuple[dict, dict]:
    """v2's (gate_up, down) configs for M-tiles of block_m rows."""
    changes = V2_TILE_CHANGES.get(block_m, {})
    return GROUPED_V2_GATE_UP | changes, GROUPED_V2_DOWN | changes


# Below 16 rows (mma.sync) Triton 3.6 lays the weights' dot operand out in runs of 4 K positions a
# thread, not wgmma's 2, so in the order above a thread's words come from two scale groups: its
# words reach registers as 8 four-byte shared-memory loads a step and its scales through shuffles
# (benchmarks/sass_counts.py). The mma.sync order (`_v2_position`'s SYNC) puts a thread's 4 K
# positions of each 16 in one group, its 4 words: a 16-byte run, one LDS.128 (a quarter warp's
# 8 lanes read 2 rows' 64 bytes each: no bank conflicts, where v2's order loses half its
# shared-load wavefronts to them, ncu session 28), and no scale shuffles. Until session 28 it was
# timed only with the activation swap (below; removed since), which costs the activations' tile its
# swizzle, and slower (session 21: 758.9 against 735.4 us a layer; session 27: 632 against 617).
# Alone (offline, sm_90, triton 3.6, the repacked words, 8 groups a step: 447 -> 409 instructions
# a loop in gate_up, 454 -> 421 in down; the activations' tile still swizzled) it is faster
# (H100, session 29): one 120b layer at 64 tokens 596.0-596.8 us against 612.4-613.4
# (interleaved in one process, -2.7%), C=64 2,356.8 against 2,271.0 and 2,320.0 against 2,249.3
# output tok/s (two machines, each order run first once). On by default
# (GOSSAMER_V2_SYNC_ORDER=0 for v2's order).
V2_SYNC_ORDER = os.environ.get("GOSSAMER_V2_SYNC_ORDER", "1") != "0"


def _v2_sync_order(block_m: int) -> bool:
    """Whether v2 tiles of block_m rows take the mma.sync K order (V2_SYNC_ORDER): below 16 rows
    the MMA is mma.sync, whose operand layout in Triton 3.6 gives a thread runs of 4 K positions
    (wgmma's: 2)."""
    return V2_SYNC_ORDER and block_m < 16


# Two ways to fewer instructions a weight below 16 rows were measured slower and removed in
# session 36 (git history has them): the activations stored with position bits 1 and 4 swapped,
# so that each mma.sync's B registers are one 8-byte shared load (411 instead of 447 a gate_up
# loop offline, but 747-758 us a 120b layer at 64 tokens against 617-622, H100, session 27: the
# permute after the load cost the activations' tile its swizzle), and fp16 operands with one dot
# per scale group (372 / 362 a loop offline, but 706-722 us against 596-613 at best, H100,
# sessions 28-29: bound on shared memory, its wavefronts doubled).
_V2_KEEP = tl.constexpr(0x81C081C0 - (1 << 32))  # bf16 lanes: magnitude bits 6..8, sign 15
# Triton 3.6 pipelines v2's wgmmas across steps (wait_group 7 after each of a step's 8), but their
# A operands are registers that the next step's dequantization overwrites before that wait
# (sm_90 SASS: the loop branches back with wgmmas in flight, and the next step writes the
# registers the previous step's HGMMAs read). PTX leaves that undefined; tiles of 64 and 128 rows
# computed wrong results on an H100 (session 22). Tiles of more than this many rows wait for
# their MMAs each step, which made them right (session 23). The 16- and 32-row tiles had the
# same hazards (benchmarks/wgmma_hazards.py lists them) though they always matched the
# reference; they wait too (correct first), at a small cost (H100, session 23, one 120b layer,
# separate runs: 16 rows at 256 tokens 868.1 -> 863.9 us; 32 rows at 1024 tokens 1429 -> 1468
# (+2.7%), at 8192 6833 -> 6660). 8-row tiles are mma.sync, which does not run
# asynchronously. GOSSAMER_V2_ASYNC_MMA_MAX_M for A/B runs.
_V2_ASYNC_MMA_MAX_M = tl.constexpr(int(os.environ.get("GOSSAMER_V2_ASYNC_MMA_MAX_M", "8")))


@triton.jit
def _v2_position(k, GB: tl.constexpr, SYNC: tl.constexpr = False):
    """Position of element k of a row in the v2 order of steps of GB scale groups (SYNC: the
    mma.sync order, see `_v2_sync_order`)."""
    BK: tl.constexpr = GB * 32
    e = k % BK
    group = e // 32
    code = e % 8
    j = code % 4
    h = code // 4
    wi = (e % 32) // 8
    if SYNC:
        inner = h + 2 * (wi % 2) + 4 * (group % 4) + 16 * (wi // 2) + 32 * (j % 2) + 64 * (j // 2)
    else:
        inner = h + 2 * (group % 4) + 8 * wi + 32 * (j % 2) + 64 * (j // 2)
    return k - e + inner + 128 * (group // 4)


@triton.jit
def _v2_group_of(p, SYNC: tl.constexpr):
    """The scale group (within its step's first 4, plus 4 per 128) of stored position p of a
    step."""
    if SYNC:
        return 4 * (p // 128) + (p // 4) % 4
    else:
        return 4 * (p // 128) + (p // 2) % 4


def _v2_padded(size: int, groups_per_step: int) -> int:
    """A row of `size` elements padded to whole v2 steps."""
    step = groups_per_step * MXFP4_GROUP
    return triton.cdiv(size, step) * step


@triton.jit
def _v2_pair_bits(words, J: tl.constexpr, LAYOUT: tl.constexpr):
    """bf16x2 words holding codes J and J + 4 of each int32 word as e2m1 * 2^-126 (magnitude in
    bits 6..8 of a lane, sign in 15): the bits of _dequant_words' shift pairs, in 3 instructions.
    An AND isolates both nibbles, a multiply by 2^a + 2^b adds two copies that share no bits (so
    no carries), one with the magnitude in place and one with the sign, and an AND keeps those."""
    if LAYOUT == _IS_FP16_LANES:
        return _v2_fp16_layout_bits(words, J)
    elif LAYOUT > _IS_FP16_LANES:
        return _layout_lanes(words, J, LAYOUT, True)
    if J >= 2:
        words = words >> 8  # codes 2, 3 (6, 7) move to 0, 1 (4, 5); the AND drops the sign fill
    if J % 2 == 0:
        copies = (words & 0x000F000F) * ((1 << 6) + (1 << 12))
    else:
        copies = (words & 0x00F000F0) * ((1 << 2) + (1 << 8))
    return copies & _V2_KEEP


@triton.jit
def _v2_fp16_layout_bits(words, J: tl.constexpr):
    """`_v2_pair_bits` for LAYOUT_FP16_LANES words in 12 instructions a word (the published
    layout's take 13): pairs 0-2 as (shifted & magnitude) | (shifted & sign), pairs 1 and 2 sharing
    the shift by 3; pair 3 with the multiply trick. Found by a search over recipes of shifts,
    masks and two-copy multiplies (the fp16 lanes' placement cannot give all four pairs cheaply)."""
    if J == 0:
        return ((words >> 3) & 0x01C001C0) | (words & _SIGN_PAIR)
    elif J == 1:
        return (words & 0x01C001C0) | ((words << 3) & _SIGN_PAIR)
    elif J == 2:
        return ((words << 3) & 0x01C001C0) | ((words << 1) & _SIGN_PAIR)
    else:
        return ((words & _FP16_LANES_MASK3) * ((1 << 6) + (1 << 2))) & _V2_KEEP


@triton.jit
def _v2_rows(t, REP: tl.constexpr, NW: tl.constexpr):
    """[GH, REP, 2, NW, 8, X] as loaded -> [REP * NW * 16, GH, X], rows in the accumulator's order
    (a relabeling: no data moves)."""
    t = tl.permute(t, (1, 3, 2, 4, 0, 5))
    return tl.reshape(t, (REP * NW * 16, t.shape[4], t.shape[5]))


# The words' shared-memory tile is unswizzled (they are not a dot operand when Triton lays it out).
# Loaded as [.., 8 rows, 16 words] its rows sit 64 bytes apart, so the 8 rows of a warp's
# four-byte loads fall on two bank offsets: 4-way conflicts (ncu, H100, session 28: 48% of the
# 8-row gate_up's shared-load wavefronts are conflicts, none from the swizzled activations).
# Group-major ([.., 4 groups, 8 rows, 4 words]) puts the rows 16 bytes apart: conflicts 20.0M ->
# 6.7M a launch, but the layer ran 26% slower (780.7 us against 620.0 at 64 tokens, C=64 1,826
# against 2,208 tok/s; H100, session 28): the conflicts moved to the async copies' writes, whose
# lanes Triton gives to the loaded dims in index order. Removed in session 36 (git history has it).


@triton.jit
def _v2_words(w_ptr, rows, g0, G: tl.constexpr, GB: tl.constexpr, MASKED: tl.constexpr):
    """rows [REP, 2, NW, 8] (packed rows, counted from w_ptr) -> int32 words [R, GB/4, 4, 4] of
    the groups g0 + 4 GH + GL: one 16-byte run per (row, group), in the lane that uses it."""
    REP: tl.constexpr = rows.shape[0]
    NW: tl.constexpr = rows.shape[2]
    gh = tl.arange(0, GB // 4)[:, None, None, None, None, None]
    word = tl.arange(0, 16)[None, None, None, None, None, :]  # 4 GL + wi
    ptrs = w_ptr + rows[None, :, :, :, :, None] * (G * 4) + (g0 * 4 + 16 * gh + word)
    if MASKED:
        words = tl.load(ptrs, mask=g0 + 4 * gh + word // 4 < G, other=0)
    else:
        words = tl.load(ptrs)
    return tl.reshape(_v2_rows(words, REP, NW), (REP * NW * 16, GB // 4, 4, 4))


@triton.jit
def _v2_scales(
    s_ptr, rows, g0, scale_step, G: tl.constexpr, GB: tl.constexpr, MASKED: tl.constexpr
):
    """uint8 scales [R, GB/4, 4] of the groups g0 + 4 GH + GL, in the words' layout.

    NOTE: the pointers are built with the dims reversed. With scale_step unknown at compile time
    no dim looks contiguous, and Triton 3.6 then gives the load's lanes and warps to the dims in
    the order written: lanes to GL and the row's lane dim, warps to NW, as in the words' layout,
    so the scales need no layout conversion (written in the words' order, the SASS had up to
    ~190 shuffles and selects per step)."""
    REP: tl.constexpr = rows.shape[0]
    NW: tl.constexpr = rows.shape[2]
    gl = tl.arange(0, 4)[:, None, None, None, None, None]
    gh = tl.arange(0, GB // 4)[None, None, None, None, None, :]
    group = g0 + 4 * gh + gl  # [4, 1, 1, 1, 1, GH]
    reversed_rows = tl.permute(rows, (3, 2, 1, 0))[None, :, :, :, :, None]
    ptrs = s_ptr + reversed_rows * G + group * scale_step  # [4, 8, NW, 2, REP, GH]
    if MASKED:
        scales = tl.load(ptrs, mask=group < G, other=0)
    else:
        scales = tl.load(ptrs)
    return _v2_rows(tl.permute(scales, (5, 4, 3, 2, 1, 0)), REP, NW)


@triton.jit
def _v2_scales_padded(s_ptr, rows, g0, S_ROW: tl.constexpr, GB: tl.constexpr):
    """`_v2_scales` from scales padded to rows of S_ROW bytes (whole steps of GB groups, GB a
    multiple of 4; V2_PADDED_SCALES): a row's GB scales of a step are one aligned run that the
    pipeliner copies asynchronously, no masks (the padding past G is zeros)."""
    REP: tl.constexpr = rows.shape[0]
    NW: tl.constexpr = rows.shape[2]
    gh = tl.arange(0, GB // 4)[:, None, None, None, None, None]
    gl = tl.arange(0, 4)[None, None, None, None, None, :]
    ptrs = s_ptr + rows[None, :, :, :, :, None] * S_ROW + (g0 + 4 * gh + gl)
    return _v2_rows(tl.load(ptrs), REP, NW)  # [R, GH, 4]


@triton.jit
def _v2_weight_tile(words, scales, LANES: tl.constexpr, LAYOUT: tl.constexpr,
                    SYNC: tl.constexpr = False):  # fmt: skip
    """words [R, GH, 4, 4] + scales [R, GH, 4] -> [R, GH * 128] weights * 2^-64 in the v2 K order
    (SYNC: the mma.sync one; bf16 with LANES_BF16_PTX, else fp32 computed as the PTX would)."""
    pairs = _bf16_scale_pairs(scales)[:, :, :, None]  # both lanes 2^(s-65)
    if LANES == 1:  # LANES_BF16_PTX
        q0 = _scaled_bf16_pairs(_v2_pair_bits(words, 0, LAYOUT), pairs)
        q1 = _scaled_bf16_pairs(_v2_pair_bits(words, 1, LAYOUT), pairs)
        q2 = _scaled_bf16_pairs(_v2_pair_bits(words, 2, LAYOUT), pairs)
        q3 = _scaled_bf16_pairs(_v2_pair_bits(words, 3, LAYOUT), pairs)
    else:
        q0 = _emulated_bf16_pairs(_v2_pair_bits(words, 0, LAYOUT), pairs)
        q1 = _emulated_bf16_pairs(_v2_pair_bits(words, 1, LAYOUT), pairs)
        q2 = _emulated_bf16_pairs(_v2_pair_bits(words, 2, LAYOUT), pairs)
        q3 = _emulated_bf16_pairs(_v2_pair_bits(words, 3, LAYOUT), pairs)
    values = tl.join(tl.join(q0, q1), tl.join(q2, q3))  # [R, GH, GL, wi, h, j % 2, j // 2]
    if SYNC:  # [R, GH, j // 2, j % 2, wi // 2, GL, wi % 2, h]
        values = tl.reshape(values, (words.shape[0], words.shape[1], 4, 2, 2, 2, 2, 2))
        values = tl.permute(values, (0, 1, 7, 6, 3, 2, 4, 5))
    else:
        values = tl.permute(values, (0, 1, 6, 5, 3, 2, 4))  # [R, GH, j // 2, j % 2, wi, GL, h]
    return tl.reshape(values, (words.shape[0], words.shape[1] * 128))


@triton.jit
def _v2_step(acc, x_ptrs, w_ptr, rows, scales, g0, G: tl.constexpr, GB: tl.constexpr,
             LANES: tl.constexpr, DOT_BF16: tl.constexpr, MASKED: tl.constexpr,
             LAYOUT: tl.constexpr, SYNC: tl.constexpr):  # fmt: skip
    """acc [R, M] += the weight tile of groups g0 .. g0 + GB @ the matching activations."""
    p = tl.arange(0, GB * 32)
    if MASKED:  # the last partial step: positions of missing groups are never written
        group = g0 + _v2_group_of(p, SYNC)
        a = tl.load(x_ptrs + g0 * 32 + p[None, :], mask=(group < G)[None, :], other=0.0)
    else:
        a = tl.load(x_ptrs + g0 * 32 + p[None, :])
    words = _v2_words(w_ptr, rows, g0, G, GB, MASKED)
    w = _v2_weight_tile(words, scales, LANES, LAYOUT, SYNC)
    return _accumulate(acc, a, w, DOT_BF16, True)


@triton.jit
def _v2_matmul(
    x_ptrs,  # [M, 1] the M rows of activations (v2 order)
    w_ptr,
    s_ptr,
    rows,  # [REP, 2, NW, 8] packed rows counted from w_ptr / s_ptr
    scale_step,
    K: tl.constexpr,
    GB: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    SCALE_PREFETCH: tl.constexpr,
    LANES: tl.constexpr,
    DOT_BF16: tl.constexpr,
    LAYOUT: tl.constexpr,
    SYNC: tl.constexpr,
    S_ROW: tl.constexpr = 0,
):
    """-> fp32 [R, M]: the tile's weight rows times the activations (the accumulator's row order).

    Whole steps run in a pipelined loop without masks; a last partial step runs after it.
    S_ROW > 0: the scales are padded to rows of S_ROW bytes (`_v2_scales_padded`)."""
    G: tl.constexpr = K // 32
    G_FULL: tl.constexpr = G // GB * GB
    acc = tl.zeros([rows.shape[0] * rows.shape[2] * 16, x_ptrs.shape[0]], tl.float32)
    if SCALE_PREFETCH and S_ROW == 0:  # a register double buffer: the loads are not async copies
        next_scales = _v2_scales(s_ptr, rows, 0, scale_step, G, GB, True)
    for g0 in tl.range(0, G_FULL, GB, num_stages=NUM_STAGES):
        if S_ROW > 0:
            scales = _v2_scales_padded(s_ptr, rows, g0, S_ROW, GB)
        elif SCALE_PREFETCH:
            scales = next_scales
            next_scales = _v2_scales(s_ptr, rows, g0 + GB, scale_step, G, GB, True)
        else:
            scales = _v2_scales(s_ptr, rows, g0, scale_step, G, GB, False)
        acc = _v2_step(acc, x_ptrs, w_ptr, rows, scales, g0, G, GB, LANES, DOT_BF16, False, LAYOUT,
                       SYNC)  # fmt: skip
        if x_ptrs.shape[0] > _V2_ASYNC_MMA_MAX_M:
            # a use of the accumulator that is not a dot: the step's MMAs finish here (see
            # _V2_ASYNC_MMA_MAX_M); g0 >= 0 always holds, but the compiler cannot fold it
            acc = tl.where(g0 >= 0, acc, 0.0)
    if G_FULL < G:
        if S_ROW > 0:
            scales = _v2_scales_padded(s_ptr, rows, G_FULL, S_ROW, GB)
        elif SCALE_PREFETCH:
            scales = next_scales
        else:
            scales = _v2_scales(s_ptr, rows, G_FULL, scale_step, G, GB, True)
        acc = _v2_step(acc, x_ptrs, w_ptr, rows, scales, G_FULL, G, GB, LANES, DOT_BF16, True,
                       LAYOUT, SYNC)  # fmt: skip
    return acc * _LANE_RESCALE


@triton.jit
def _v2_tile_dims(REP: tl.constexpr, NW: tl.constexpr):
    """Index tensors of the row tile [REP, 2, NW, 8]: (rep, d, w, lane row)."""
    rep = tl.arange(0, REP)[:, None, None, None]
    d = tl.arange(0, 2)[None, :, None, None]
    w = tl.arange(0, NW)[None, None, :, None]
    lane_row = tl.arange(0, 8)[None, None, None, :]
    return rep, d, w, lane_row


@triton.jit(do_not_specialize=["scale_step"])
def _v2_gate_up_kernel(
    x_ptr,  # [T, X_WIDTH] activations in the v2 order of this kernel's steps
    sorted_pairs_ptr,  # [P] int32: pair index (token * TOP_K + slot) in expert order
    counts_ptr,  # [E] int32 pairs per expert
    offsets_ptr,  # [E] int32 first sorted row of each expert
    tile_ends_ptr,  # [E] int32 cumulative M-tile count
    w_ptr,  # [E, 2I, H/32, 4] int32 (packed rows as words)
    scales_ptr,  # [E, 2I, H/32] uint8
    bias_ptr,  # [E, 2I]
    act_ptr,  # [P, ACT_WIDTH] out: sorted rows, in the v2 order of the down kernel's steps
    limit,
    alpha,
    scale_step,  # 1, not specialized (see _v2_scales)
    H: tl.constexpr,
    INTER: tl.constexpr,
    E: tl.constexpr,
    E_P2: tl.constexpr,
    TOP_K: tl.constexpr,
    DOT_BF16: tl.constexpr,
    LANES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    REP: tl.constexpr,
    NW: tl.constexpr,
    GROUPS_PER_STEP: tl.constexpr,
    DOWN_GROUPS: tl.constexpr,
    X_WIDTH: tl.constexpr,  # H padded to whole steps
    ACT_WIDTH: tl.constexpr,  # INTER padded to whole steps of the down kernel
    NUM_STAGES: tl.constexpr,
    SCALE_PREFETCH: tl.constexpr,
    LAYOUT: tl.constexpr = 0,  # LAYOUT_HF or LAYOUT_FP16_LANES (the words' bit layout)
    SYNC: tl.constexpr = False,  # the mma.sync K order (`_v2_sync_order`) of activations and weights
    S_ROW: tl.constexpr = 0,  # > 0: scales padded to rows of S_ROW bytes (V2_PADDED_SCALES)
):
    pid_n = tl.program_id(0)
    expert, row_start, row_end = _expert_tile(
        tl.program_id(1), counts_ptr, offsets_ptr, tile_ends_ptr, E, E_P2, BLOCK_M
    )
    if expert >= E:
        return
    expert = expert.to(tl.int64)
    sorted_row = row_start + tl.arange(0, BLOCK_M)
    sorted_ok = sorted_row < row_end
    # rows past the expert's end read token 0's activations; their results are never stored
    token = tl.load(sorted_pairs_ptr + sorted_row, mask=sorted_ok, other=0) // TOP_K
    BP: tl.constexpr = 8 * NW * REP  # intermediate pairs per program
    rep, d, w, lane_row = _v2_tile_dims(REP, NW)
    # clamped past the end: valid rows whose results are never stored
    pair_index = tl.minimum(pid_n * BP + 8 * NW * rep + 8 * w + lane_row, INTER - 1)
    rows = expert * (2 * INTER) + 2 * pair_index + d  # gate rows at d = 0, up rows at d = 1
    x_ptrs = x_ptr + token[:, None].to(tl.int64) * X_WIDTH
    acc = _v2_matmul(x_ptrs, w_ptr, scales_ptr, rows, scale_step, H, GROUPS_PER_STEP, NUM_STAGES,
                     SCALE_PREFETCH, LANES, DOT_BF16, LAYOUT, SYNC, S_ROW)  # fmt: skip

    gate, up = tl.split(tl.permute(tl.reshape(acc, (REP, NW, 2, 8, BLOCK_M)), (0, 1, 3, 4, 2)))
    j = pid_n * BP + tl.arange(0, BP)
    j_ok = j < INTER
    bias_row = bias_ptr + expert * (2 * INTER) + 2 * j
    gate = tl.reshape(gate, (BP, BLOCK_M)) + tl.load(bias_row, mask=j_ok).to(tl.float32)[:, None]
    up = tl.reshape(up, (BP, BLOCK_M)) + tl.load(bias_row + 1, mask=j_ok).to(tl.float32)[:, None]
    act = _swiglu(gate, up, limit, alpha)  # [BP, M]
    position = _v2_position(j, DOWN_GROUPS, SYNC)
    tl.store(
        act_ptr + sorted_row[None, :].to(tl.int64) * ACT_WIDTH + position[:, None],
        act.to(act_ptr.dtype.element_ty),
        mask=sorted_ok[None, :] & j_ok[:, None],
    )


@triton.jit(do_not_specialize=["scale_step"])
def _v2_down_kernel(
    act_ptr,  # [P, X_WIDTH] sorted rows, in the v2 order of this kernel's steps
    sorted_pairs_ptr,  # [P] int32
    route_w_ptr,  # [P] fp32, by pair index
    counts_ptr,
    offsets_ptr,
    tile_ends_ptr,
    w_ptr,  # [E, H, INTER/32, 4] int32
    scales_ptr,  # [E, H, INTER/32] uint8
    bias_ptr,  # [E, H]
    y_ptr,  # [P, H] out (fp32, bf16 on prefill tiles), by pair index: route weight * output
    scale_step,  # 1, not specialized (see _v2_scales)
    H: tl.constexpr,
    INTER: tl.constexpr,
    E: tl.constexpr,
    E_P2: tl.constexpr,
    DOT_BF16: tl.constexpr,
    LANES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    REP: tl.constexpr,
    NW: tl.constexpr,
    GROUPS_PER_STEP: tl.constexpr,
    X_WIDTH: tl.constexpr,  # INTER padded to whole steps
    NUM_STAGES: tl.constexpr,
    SCALE_PREFETCH: tl.constexpr,
    LAYOUT: tl.constexpr = 0,  # LAYOUT_HF or LAYOUT_FP16_LANES (the words' bit layout)
    SYNC: tl.constexpr = False,  # the mma.sync K order (`_v2_sync_order`) of activations and weights
    S_ROW: tl.constexpr = 0,  # > 0: scales padded to rows of S_ROW bytes (V2_PADDED_SCALES)
):
    pid_n = tl.program_id(0)
    expert, row_start, row_end = _expert_tile(
        tl.program_id(1), counts_ptr, offsets_ptr, tile_ends_ptr, E, E_P2, BLOCK_M
    )
    if expert >= E:
        return
    expert = expert.to(tl.int64)
    sorted_row = row_start + tl.arange(0, BLOCK_M)
    sorted_ok = sorted_row < row_end
    R: tl.constexpr = 16 * NW * REP  # output columns per program
    rep, d, w, lane_row = _v2_tile_dims(REP, NW)
    col = pid_n * R + 16 * NW * rep + 16 * w + 8 * d + lane_row
    rows = expert * H + tl.minimum(col, H - 1)  # clamped: valid rows, never stored
    # rows past the expert's end re-read its last row (in bounds); their results are never stored
    act_row = tl.minimum(sorted_row, row_end - 1)
    x_ptrs = act_ptr + act_row[:, None].to(tl.int64) * X_WIDTH
    acc = _v2_matmul(x_ptrs, w_ptr, scales_ptr, rows, scale_step, INTER, GROUPS_PER_STEP,
                     NUM_STAGES, SCALE_PREFETCH, LANES, DOT_BF16, LAYOUT, SYNC, S_ROW)  # fmt: skip

    col = pid_n * R + tl.arange(0, R)
    col_ok = col < H
    pair = tl.load(sorted_pairs_ptr + sorted_row, mask=sorted_ok, other=0)
    bias = tl.load(bias_ptr + expert * H + col, mask=col_ok, other=0.0).to(tl.float32)
    route_w = tl.load(route_w_ptr + pair, mask=sorted_ok, other=0.0)
    tl.store(
        y_ptr + pair[None, :].to(tl.int64) * H + col[:, None],
        (acc + bias[:, None]) * route_w[None, :],
        mask=sorted_ok[None, :] & col_ok[:, None],
    )


# The scales' one-byte loads into registers (SCALE_PREFETCH: a step ahead, as async copies need 4
# bytes or more) share ptxas's few scoreboards with the shared-memory loads of the step: the
# 8-row gate_up's LDS.64 of activations and its LDG.U8 of scales set the same barriers (sm_90
# SASS control bits, triton 3.6), so a register move that only waits for the activations waits
# for the global loads too. Nsight Compute's warp sampling (H100, session 30, one 120b layer at 64
# tokens, `benchmarks/ncu_source.py`): 13.5% of gate_up's samples (12.7% of down's) sit at that
# one move, waiting on long_scoreboard. Padded to rows of whole steps (a multiple of 8 bytes),
# a row's scales of a step are one aligned 8-byte run, which the pipeliner copies to shared
# memory with the words: no global loads left in the loop (offline: 409 -> 407 instructions a
# loop in gate_up, 421 -> 399 in down). This experiment keeps a padded copy of each layer's
# scales (made on the first eager call: a second copy of the scales, ~3.8 GB on 120b;
# GOSSAMER_V2_PADDED_SCALES=1, moe_grouped_sweep --ab-padded). On an H200 (session 31) one 120b
# layer at 64 tokens took 514-517 us against 524-534 and the C=64 decode step 0.5-0.6% less, but
# prefill's tiles were slower with it (1.84 -> 2.07 s at C=64), so only tiles of up to
# V2_PADDED_MAX_ROWS rows use it. Off: worth it only as scales padded at load time (no copy).
V2_PADDED_SCALES = os.environ.get("GOSSAMER_V2_PADDED_SCALES", "0") == "1"
V2_PADDED_MAX_ROWS = 16
# (data_ptr, shape, width) -> (the padded copy, a weak reference to the scales it copies: another
# tensor at the same address is not them)
_PADDED_SCALES: dict[tuple, tuple[torch.Tensor, weakref.ref]] = {}


def _v2_padded_scales(scales: torch.Tensor, groups_per_step: int) -> tuple[torch.Tensor, int]:
    """(scales padded with zeros to rows of whole steps, the padded row in bytes); (scales, 0)
    inside a CUDA graph capture when no copy was made before it."""
    experts, rows, groups = scales.shape
    width = triton.cdiv(groups, groups_per_step) * groups_per_step
    key = (scales.data_ptr(), tuple(scales.shape), width)
    padded, source = _PADDED_SCALES.get(key, (None, None))
    if padded is None or source() is not scales:
        if scales.is_cuda and torch.cuda.is_current_stream_capturing():
            return scales, 0
        padded = torch.zeros(experts, rows, width, dtype=scales.dtype, device=scales.device)
        padded[:, :, :groups] = scales
        _PADDED_SCALES[key] = (padded, weakref.ref(scales))
    return padded, width


# Prefill's tiles (V2_MAX_BLOCK_M rows) through `moe_gluon`'s kernels, which overlap the
# dequantization with the wgmmas (Hopper only; GOSSAMER_MOE_GLUON=1). Measured (session 34, H100,
# one 120b layer at 2k-8k tokens): +1.0 to +1.9% against v2, so off.
# GOSSAMER_MOE_GLUON_BLOCK_M=128 takes 128-token tiles where experts average that many pairs;
# GOSSAMER_MOE_GLUON_WARPS and _MAXNREG set the programs' warps and registers a thread.
GLUON_PREFILL = os.environ.get("GOSSAMER_MOE_GLUON", "0") == "1"
GLUON_BLOCK_M = int(os.environ.get("GOSSAMER_MOE_GLUON_BLOCK_M", "64"))
GLUON_OPTIONS = {"num_warps": int(os.environ.get("GOSSAMER_MOE_GLUON_WARPS", "8")),
                 "maxnreg": int(os.environ.get("GOSSAMER_MOE_GLUON_MAXNREG", "0")) or None}  # fmt: skip


def moe_mxfp4_grouped_v2(
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
    """`moe_mxfp4_grouped` with the v2 kernels (see the section comment); dense experts go to v1.
    block_m and the configs override the defaults (benchmark sweeps, tests)."""
    if not experts.is_mxfp4:
        return moe_mxfp4_grouped(x, router_logits, experts, top_k, swiglu_limit, swiglu_alpha)
    num_tokens, hidden, num_experts, inter = _check(x, router_logits, experts, top_k)
    num_pairs = num_tokens * top_k
    block_m = block_m or _v2_block_m(num_pairs, num_experts)
    if GLUON_PREFILL and block_m >= V2_MAX_BLOCK_M and not (gate_up_config or down_config):
        from gossamer.kernels import moe_gluon  # Triton >= 3.6; only compiled on Hopper

        if moe_gluon.supported(x.device) and moe_gluon.takes(experts, x.dtype, hidden, inter):
            gluon_m = GLUON_BLOCK_M if num_pairs >= GLUON_BLOCK_M * num_experts else 64
            return moe_gluon.moe_mxfp4_gluon(x, router_logits, experts, top_k, swiglu_limit,
                                             swiglu_alpha, gluon_m, **GLUON_OPTIONS)  # fmt: skip
    default_gu, default_dn = v2_configs(block_m)
    gu = dict(gate_up_config or default_gu)
    dn = dict(down_config or default_dn)
    for name, config in (("gate_up", gu), ("down", dn)):
        if config["GROUPS_PER_STEP"] % 4:
            raise MoEShapeError(f"v2 {name} needs GROUPS_PER_STEP % 4 == 0, got {config}")
    x = x.contiguous()
    if num_tokens == 0:
        return torch.empty_like(x)
    sync = _v2_sync_order(block_m)
    x_layout = "v2_sync" if sync else "v2"
    ids, route_w, x_v2, _ = _route(router_logits, top_k, x, x_layout, gu["GROUPS_PER_STEP"])
    # one launch instead of _expert_schedule's ~8 (imported here: that module imports this one)
    from gossamer.kernels import moe_grouped_gemv as gemv

    gemv_max = _v2_gemv_max_count(block_m, swiglu_limit)
    if gemv_max:  # the experts of 1..gemv_max pairs to the grouped GEMV, in one tile each
        (sorted_pairs, counts, offsets, tile_ends), small = gemv.split_schedule(
            ids, num_experts, block_m, gemv_max, triton.next_power_of_2(gemv_max)
        )
    else:
        sorted_pairs, counts, offsets, tile_ends = gemv.expert_schedule(ids, num_experts, block_m)
    max_m_tiles = triton.cdiv(num_pairs, block_m) + min(num_experts, num_pairs)
    dot_bf16 = x.dtype == torch.bfloat16  # as in v1: bf16 tensor cores, else exact fp32
    act_dtype = torch.bfloat16 if dot_bf16 else torch.float32
    act_width = _v2_padded(inter, dn["GROUPS_PER_STEP"])
    act = torch.empty(num_pairs, act_width, dtype=act_dtype, device=x.device)  # sorted order
    lanes = LANES_BF16_PTX if _lanes() == LANES_BF16_PTX else LANES_BF16_EMULATED
    common = {"E": num_experts, "E_P2": triton.next_power_of_2(num_experts), "DOT_BF16": dot_bf16,
              "LANES": lanes, "BLOCK_M": block_m, "LAYOUT": layout_code(experts),
              "SYNC": sync}  # fmt: skip
    schedule = (sorted_pairs, counts, offsets, tile_ends)
    gu_scales, dn_scales, gu_row, dn_row = experts.gate_up_scales, experts.down_scales, 0, 0
    if V2_PADDED_SCALES and block_m <= V2_PADDED_MAX_ROWS:
        gu_scales, gu_row = _v2_padded_scales(gu_scales, gu["GROUPS_PER_STEP"])
        dn_scales, dn_row = _v2_padded_scales(dn_scales, dn["GROUPS_PER_STEP"])
    pairs_per_program = 8 * gu["REP"] * gu["num_warps"]
    _v2_gate_up_kernel[(triton.cdiv(inter, pairs_per_program), max_m_tiles)](
        x_v2, *schedule,
        experts.gate_up_blocks.view(torch.int32), gu_scales,
        experts.gate_up_bias.contiguous(), act, float(swiglu_limit), float(swiglu_alpha), 1,
        H=hidden, INTER=inter, TOP_K=top_k, DOWN_GROUPS=dn["GROUPS_PER_STEP"],
        X_WIDTH=x_v2.shape[1], ACT_WIDTH=act_width, NW=gu["num_warps"], S_ROW=gu_row, **common,
        **gu,
    )  # fmt: skip
    y = torch.empty(num_pairs, hidden, dtype=_v2_partials_dtype(x.dtype, block_m), device=x.device)
    cols_per_program = 16 * dn["REP"] * dn["num_warps"]
    _v2_down_kernel[(triton.cdiv(hidden, cols_per_program), max_m_tiles)](
        act, sorted_pairs, route_w, counts, offsets, tile_ends,
        experts.down_blocks.view(torch.int32), dn_scales,
        experts.down_bias.contiguous(), y, 1, H=hidden, INTER=inter, X_WIDTH=act_width,
        NW=dn["num_warps"], S_ROW=dn_row, **common, **dn,
    )  # fmt: skip
    if gemv_max:
        _small_experts_by_gemv(x, router_logits, small, route_w, experts, top_k, swiglu_limit,
                               swiglu_alpha, y)  # fmt: skip
    if not V2_SLOT_SUM:
        return y.view(num_tokens, top_k, hidden).sum(dim=1).to(x.dtype)
    out = torch.empty_like(x)
    gemv.slot_sum(y, out, top_k)
    return out


# Decode tiles: the experts that hold at most V2_GEMV_MAX_COUNT pairs go to the expert-grouped fp16
# GEMV (moe_grouped_gemv.py) and the rest to v2, in one call. v2 dequantizes an expert's weights
# once whatever its tokens (bf16 lanes: 3.2 instructions a weight in the default 8-row loop,
# offline); the GEMV unpacks fp16 lanes and pays its HFMA2s per token (2.2 a weight at one token,
# 3.0 at two). At C=64 (256 pairs on ~111 experts) ~31% of the busy experts hold one pair.
# Measured on an H100 (session 35, benchmarks/tokens_per_expert_ab.py, one 120b layer, medians of
# 3 interleaved rounds): a busy expert costs v2 5.3-5.5 us at 1-4 pairs and the GEMV 4.7-4.9 at
# one pair, 5.8 at two; priced per expert, the split would take 3-9% off C=64's layer. Measured
# at C=64's routings it does not: v2 594-606 us against 605 (one pair to the GEMV) and 624-659
# (two). The GEMV's grid first had a row of programs for each expert that could be small
# (min(E, P) = 128, ~34 are): +88 us a layer where none is, 69k programs finding no tile (644-661
# us at C=64's routings; C=64 itself 1,982.6 against 2,096.1 tok/s). Rows of 4x wider tiles cut
# that to +27 us but slowed the real tiles 9% (610 us); PDL off, +50 (616). Now V2_GEMV_M_PROGRAMS
# rows of programs take every V2_GEMV_M_PROGRAMS-th small expert in turn (moe_grouped_gemv's
# LOOP_M): +17 us where none is small, but 19% slower where all are (tiles in turn do not overlap),
# 604.9 us (16 rows) / 603.2 (32) at C=64's routings. Two launches run their partial waves one
# after the other; only a single launch over both kinds of tile could keep the per-expert gain.
# Off (0); kept for the H200, where v2 is issue-bound and the GEMV's fewer instructions may pay
# (not measured there: `bash benchmarks/runs/session35_e.sh`).
V2_GEMV_MAX_COUNT = int(os.environ.get("GOSSAMER_V2_GEMV_MAX_COUNT", "0"))
V2_GEMV_M_PROGRAMS = int(os.environ.get("GOSSAMER_V2_GEMV_M_PROGRAMS", "16"))


def _v2_gemv_max_count(block_m: int, swiglu_limit: float) -> int:
    """The largest expert (in pairs) v2 leaves to the grouped GEMV at this tile (0: none): decode
    tiles of up to 16 rows, a SwiGLU limit the fp16 GEMV can scale by."""
    usable = block_m <= 16 and 0.0 < swiglu_limit < 1e4
    return V2_GEMV_MAX_COUNT if usable else 0


def _small_experts_by_gemv(x, router_logits, schedule, route_w, experts, top_k, swiglu_limit,
                           swiglu_alpha, y):  # fmt: skip
    """The grouped GEMV over `schedule` (the small experts' half of a split schedule): their
    pairs' rows of y (routing weight * (expert output + bias), by pair index)."""
    from gossamer.kernels import moe_grouped_gemv as gemv

    _, _, x_h, x_unscale = route_fp16(router_logits, top_k, x)  # the same routing, fp16 x
    num_experts, hidden = router_logits.shape[1], x.shape[1]
    block_m = triton.next_power_of_2(V2_GEMV_MAX_COUNT)
    common = {"E": num_experts, "E_P2": triton.next_power_of_2(num_experts), "BLOCK_M": block_m,
              "ACT_EXP": act_exponent(swiglu_limit), "LAYOUT": layout_code(experts),
              **pdl.launch_options(x.device)}  # fmt: skip
    # at most one tile a small expert
    grid_m, loop_m = gemv.loop_grid(min(num_experts, y.shape[0]), V2_GEMV_M_PROGRAMS)
    act = gemv.gate_up(x_h, x_unscale, schedule, experts, top_k, swiglu_limit, swiglu_alpha,
                       grid_m, common, gemv.GEMV_GATE_UP, loop_m)  # fmt: skip
    gemv.down(act, schedule, route_w, experts, hidden, grid_m, common, gemv.GEMV_DOWN, y=y,
              loop_m=loop_m)  # fmt: skip


# v2's per-pair expert outputs (y, summed over each token's slots by slot_sum in fp32) in bf16 on
# prefill tiles with bf16 activations: at 8,192 tokens y is 377 MB a layer in fp32, written by
# down and read back by the slot sum (2.4% of a 120b prefill step on an H100, thirty-third
# session); bf16 halves it. Each expert's output is rounded to bf16 once before the sum, as the
# bf16 reference model does. Decode tiles keep fp32 (y is ~3 MB there). Measured on an H100
# (session 35, moe_switch_ab.py, one 120b layer): -1.6% at 4,096 tokens, -1.0% (means) at 8,192;
# error against the fp32 torch reference 2.3e-3 -> 2.9e-3. GOSSAMER_V2_BF16_PARTIALS=0 for A/B.
V2_BF16_PARTIALS = os.environ.get("GOSSAMER_V2_BF16_PARTIALS", "1") != "0"


def _v2_partials_dtype(x_dtype: torch.dtype, block_m: int) -> torch.dtype:
    """The dtype of v2's per-pair outputs y at M-tiles of block_m rows (V2_BF16_PARTIALS)."""
    prefill = block_m >= V2_MAX_BLOCK_M
    return (
        torch.bfloat16
        if V2_BF16_PARTIALS and prefill and x_dtype == torch.bfloat16
        else torch.float32
    )


# v2's slots summed by the grouped GEMV's one-launch slot sum instead of torch's sum and cast (two
# launches: 5.3 + 1.5 us a layer at 120b batch 64 on an H100, step_profile.py, session 22).
# GOSSAMER_V2_SLOT_SUM=0 for A/B runs.
V2_SLOT_SUM = os.environ.get("GOSSAMER_V2_SLOT_SUM", "1") != "0"


# Inline PTX only when compiling for the GPU: TRITON_INTERPRET (the CPU tests) cannot run it.
_COMPILED = not _is_interpreted(_decode_gate_up_kernel)
# The fp32 decode GEMV's inline-PTX unpack. Off: benchmarks/moe_decode_sweep.py measured the
# plain-Triton decoding faster on the H200 (2026-12-02: the whole T=1 MoE layer 55.8 us without
# the PTX unpack, 67.2 us with it).
USE_INLINE_PTX = False
# The grouped kernels' bf16 lanes scaled by one packed bf16 fma (inline PTX) instead of the
# fp16 -> fp32 -> bf16 detour: 5.0 against 7.0 SASS instructions per weight (sm_90, triton 3.6,
# gate_up at BLOCK_M 16), and 120b batch-64 steps measured 51.9 ms with it against 53.7-54.1 ms
# without (2026-12-02, different runs). The CPU tests check its arithmetic emulated
# (EMULATE_BF16_LANES) and the GPU tests check it against the torch twin.
GROUPED_INLINE_PTX = True


# Tests set this to run the grouped kernels' bf16-lane arithmetic (emulated) on the CPU.
EMULATE_BF16_LANES = False


def _ptx() -> bool:
    return _COMPILED and USE_INLINE_PTX


def _lanes() -> int:
    if _COMPILED and GROUPED_INLINE_PTX:
        return LANES_BF16_PTX
    return LANES_BF16_EMULATED if EMULATE_BF16_LANES else LANES_FP16


# ----------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------


def moe_mxfp4(
    x: torch.Tensor,
    router_logits: torch.Tensor,
    experts: ExpertWeights,
    top_k: int,
    swiglu_limit: float,
    swiglu_alpha: float,
) -> torch.Tensor:
    """`Ops.moe` on the GPU: x [T, H] (bf16/fp16/fp32), router_logits [T, E] -> [T, H] in x.dtype.

    Picks the GEMV path for MXFP4 experts when T * top_k <= min(DECODE_MAX_PAIRS,
    DECODE_PAIRS_PER_EXPERT * E) (a static choice on shapes, so each CUDA graph captures one
    path), else the grouped path (also for dense experts; v2 when GROUPED_V2)."""
    max_pairs = min(DECODE_MAX_PAIRS, DECODE_PAIRS_PER_EXPERT * router_logits.shape[1])
    # the fp16 GEMVs scale the SwiGLU output by its clamp, so they need a finite limit
    fp16 = DECODE_FP16 and 0.0 < swiglu_limit < 1e4
    if experts.is_mxfp4 and x.shape[0] * top_k <= max_pairs:
        decode = moe_mxfp4_decode_fp16 if fp16 else moe_mxfp4_decode
        return decode(x, router_logits, experts, top_k, swiglu_limit, swiglu_alpha)
    if experts.is_mxfp4 and fp16 and x.shape[0] * top_k <= GROUPED_GEMV_MAX_PAIRS:
        # NOTE: imported here, as moe_grouped_gemv imports this module; the CPU tests' interpreted
        # copy of this module gets the interpreted copy of that one (tests/kernels/interpreted.py)
        from gossamer.kernels.moe_grouped_gemv import moe_mxfp4_grouped_gemv

        return moe_mxfp4_grouped_gemv(x, router_logits, experts, top_k, swiglu_limit, swiglu_alpha)
    grouped = moe_mxfp4_grouped_v2 if GROUPED_V2 else moe_mxfp4_grouped  # v2 sends dense to v1
    return grouped(x, router_logits, experts, top_k, swiglu_limit, swiglu_alpha)


def _check(
    x: torch.Tensor, router_logits: torch.Tensor, experts: ExpertWeights, top_k: int
) -> tuple[int, int, int, int]:
    """Validate shapes; returns (T, H, E, I)."""
    if x.dim() != 2 or router_logits.dim() != 2 or router_logits.shape[0] != x.shape[0]:
        raise MoEShapeError(
            f"expected x [T, H] and router_logits [T, E], got {tuple(x.shape)} and "
            f"{tuple(router_logits.shape)}"
        )
    num_tokens, hidden = x.shape
    num_experts = router_logits.shape[1]
    if not 1 <= top_k <= num_experts:
        raise MoEShapeError(f"top_k must be in 1..{num_experts} (the expert count), got {top_k}")
    if experts.is_mxfp4:
        e, rows, groups, width = experts.gate_up_blocks.shape
        down_shape = tuple(experts.down_blocks.shape)
        inter = rows // 2
        expected_down = (e, hidden, inter // MXFP4_GROUP, 16)
        if groups * MXFP4_GROUP != hidden or width != 16 or down_shape != expected_down:
            raise MoEShapeError(
                f"MXFP4 experts do not match hidden={hidden}: gate_up_blocks "
                f"{tuple(experts.gate_up_blocks.shape)}, down_blocks {down_shape}"
            )
        if inter % MXFP4_GROUP:
            raise MoEShapeError(f"the intermediate size {inter} must be a multiple of 32")
        for name in ("gate_up_blocks", "gate_up_scales", "down_blocks", "down_scales"):
            if not getattr(experts, name).is_contiguous():
                raise MoEShapeError(f"experts.{name} must be contiguous")
    else:
        e, rows, cols = experts.gate_up_dense.shape
        inter = rows // 2
        if cols != hidden or tuple(experts.down_dense.shape) != (e, hidden, inter):
            raise MoEShapeError(
                f"dense experts do not match hidden={hidden}: gate_up "
                f"{tuple(experts.gate_up_dense.shape)}, down {tuple(experts.down_dense.shape)}"
            )
    if e != num_experts:
        raise MoEShapeError(f"router_logits name {num_experts} experts but the layer has {e}")
    if hidden % 8:
        raise MoEShapeError(f"hidden size {hidden} must be a multiple of 8")
    return num_tokens, hidden, num_experts, inter
