"""Would fp8 tensor-core operands make the batched MXFP4 MoE cheaper on Hopper? An offline study.

    PYTHONPATH=. python benchmarks/fp8_operand_sass.py     # the checks, then sm_90 SASS counts

v2 (gossamer/kernels/moe_mxfp4.py) turns every e2m1 weight into bf16 for the MMA: 12 instructions
per repacked word of 8 weights, plus 4 HMUL2 for the group scale; ~3.5 instructions a weight in
all at 8-16 token rows, and on the H200 the kernel is issue-bound (session 12's ncu). e2m1 values
are exact in fp8, so the weights could enter the MMA as fp8 instead:

* **The weights** (`e5m2_registers`): from the loader's LAYOUT_FP16_LANES words, two registers
  of four e5m2 bytes each (e2m1 * 2^-14, the e2m1 subnormal landing on an e5m2 subnormal) in 9
  instructions a word (`python check` below proves every code exact). Elements 0, 1, 4, 5 have
  their sign 6 bits above their magnitude, as e5m2 wants, so one rotate serves each pair; the
  others need three shifts.
* **The activations** (`split_e4m3`): x scaled by a power of two per token, then hi = e4m3(x) and
  lo = e4m3(x - hi), two MMAs (e5m2 x e4m3, which PTX allows). hi + lo is exactly x for every
  bf16 value whose scaled magnitude is at least 2^-2 (hi rounds x's 8 significant bits to 4; the
  remainder fits e4m3's 4); below, lo is an e4m3 subnormal and the error is under 2^-10 (in units
  where the token's largest value is 224-448).
* **The group scale** can no longer ride on the weights: one K=32 MMA per scale group, and its
  partial sums times the scale into the accumulator (an FFMA per accumulator element a group).

What Triton 3.6 compiles for sm_90 (`compile_prototype`, one program: 64 weight rows on 4 warps,
steps of 8 groups, pipelined as v2): at 8 token columns the dot is mma.sync, which Hopper runs
for fp8 only by converting to fp16 (F2FP + HMMA.16816; 9.1 instructions a weight); at 16 columns
it is QGMMA.64x16x32.E5M2.E4M3 with the weights from registers and no detour through shared
memory: **449 instructions a loop, 3.51 a weight**, against v2's 3.49 (8 rows) and 3.58 (16
rows). The unpack fell to 1.1 a weight, but the FFMAs (0.5 at 16 columns), two warpgroup
arrive/waits and descriptor updates per group MMA take it back. Not built into the MoE: it pays
only if the scale can stay out of the accumulator (folded into the fp8 exponents: 5 bits, where
the e2m1 zero and subnormal need fixing) or if fp8 mma.sync were native (sm_89, sm_100).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gossamer.model import mxfp4  # noqa: E402

# ---- the recipes, in torch (int64 holding 32-bit words) -------------------------------------------

WORD = 0xFFFFFFFF
# register a: bytes 1 and 3 are elements 0 and 4 where they lie; bytes 0 and 2 are elements 5 and
# 1 rotated left by 11. register b: rotations by 1, 6 and 26 (signs and magnitudes of 2, 3, 6, 7).
A_IN_PLACE, A_ROTATED_11 = 0x8E008E00, 0x008E008E
B_ROTATED_1, B_ROTATED_6, B_ROTATED_26 = 0x800E800E, 0x0E000E00, 0x00800080
# element of the word in byte 0..3 of each register
A_ELEMENTS, B_ELEMENTS = (5, 0, 1, 4), (3, 2, 7, 6)


def rotate_left(words: torch.Tensor, bits: int) -> torch.Tensor:
    return ((words << bits) | (words >> (32 - bits))) & WORD


def e5m2_registers(words: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """LAYOUT_FP16_LANES words (int64, 32 bits each) -> two words of four e5m2 bytes."""
    a = (words & A_IN_PLACE) | (rotate_left(words, 11) & A_ROTATED_11)
    b = (
        (rotate_left(words, 1) & B_ROTATED_1)
        | (rotate_left(words, 6) & B_ROTATED_6)
        | (rotate_left(words, 26) & B_ROTATED_26)
    )
    return a, b


def check_e5m2_registers() -> None:
    """Each element's 16 codes, the other nibbles random: every byte the recipe gives is the
    element's e2m1 value * 2^-14 as e5m2."""
    generator = torch.Generator().manual_seed(0)
    for element in range(8):
        codes = torch.randint(0, 16, (16, 8), generator=generator, dtype=torch.uint8)
        codes[:, element] = torch.arange(16, dtype=torch.uint8)
        blocks = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()  # [16, 4] published bytes
        words = mxfp4.to_fp16_lanes(blocks).view(torch.int32).to(torch.int64) & WORD
        registers = e5m2_registers(words.flatten())
        values = torch.tensor(mxfp4.E2M1_VALUES)[codes.long()]
        for register, elements in zip(registers, (A_ELEMENTS, B_ELEMENTS), strict=True):
            for byte, source in enumerate(elements):
                got = ((register >> (8 * byte)) & 0xFF).to(torch.uint8).view(torch.float8_e5m2)
                want = values[:, source] * 2.0**-14
                if not torch.equal(got.float(), want):
                    raise AssertionError(f"element {source} (byte {byte}) decodes wrong")


def split_e4m3(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, K] -> (hi, lo, scale [T, 1]): x * scale = hi + lo (see the module's docstring), the
    scale a power of two that brings each row's largest magnitude into (224, 448]."""
    amax = x.float().abs().amax(dim=-1, keepdim=True).clamp_min(2.0**-100)
    scale = torch.exp2(torch.floor(torch.log2(448.0 / amax)))
    scaled = x.float() * scale
    hi = scaled.to(torch.float8_e4m3fn)
    lo = (scaled - hi.float()).to(torch.float8_e4m3fn)
    return hi, lo, scale


# ---- the Triton prototype (compiled offline) ------------------------------------------------------


def compile_prototype(token_columns: int):
    """The prototype kernel compiled for sm_90 (Triton's CUDA tools, no GPU)."""
    import sass_counts  # (imports the MoE kernels: only when compiling)

    kernel = _prototype
    signature = dict(xh_ptr="*fp8e4nv", xl_ptr="*fp8e4nv", w_ptr="*i32", s_ptr="*u8",
                     out_ptr="*fp32")  # fmt: skip
    constexprs = dict(K=2880, M=token_columns, NW=4, NUM_STAGES=3)
    return sass_counts.compile_sm90(kernel, signature, constexprs, num_warps=4)


@triton.jit
def _split8(t):
    """[A, B, 8] -> its 8 slices [A, B] along the last axis, in order."""
    t = tl.reshape(t, (t.shape[0], t.shape[1], 2, 2, 2))  # last axis 4a + 2b + c
    t0, t1 = tl.split(t)
    t00, t01 = tl.split(t0)
    t10, t11 = tl.split(t1)
    g0, g4 = tl.split(t00)
    g2, g6 = tl.split(t01)
    g1, g5 = tl.split(t10)
    g3, g7 = tl.split(t11)
    return g0, g1, g2, g3, g4, g5, g6, g7


@triton.jit
def _rotl(w, bits: tl.constexpr):
    return (w << bits) | ((w >> (32 - bits)) & ((1 << bits) - 1))


@triton.jit
def _as_e5m2(r):
    # NOTE: joined copies, not a broadcast: Triton moves a broadcast past the asm, and packed
    # elements must be the leading register dims (per-group [R, 4] words keep them so)
    four = tl.reshape(tl.join(tl.join(r, r), tl.join(r, r)), (r.shape[0], r.shape[1], 4))
    return tl.inline_asm_elementwise(asm="mov.b32 $0, $1;", constraints="=r,r,r,r,r",
                                     args=[four], dtype=tl.float8e5, is_pure=True, pack=4)  # fmt: skip


@triton.jit
def _weight_tile(words):  # [R, 4] words of one group -> [R, 32] e5m2 in the MMA's K order
    a = (words & (0x8E008E00 - (1 << 32))) | (_rotl(words, 11) & 0x008E008E)
    b = (_rotl(words, 1) & (0x800E800E - (1 << 32))) | (_rotl(words, 6) & 0x0E000E00)
    b = b | (_rotl(words, 26) & 0x00800080)
    tile = tl.permute(tl.join(_as_e5m2(a), _as_e5m2(b)), (0, 3, 1, 2))  # [R, reg, word, byte]
    return tl.reshape(tile, (words.shape[0], 32))


@triton.jit
def _group_dot(acc, words, scale, xh_ptr, xl_ptr, offsets):
    w = _weight_tile(words)
    part = tl.dot(w, tl.trans(tl.load(xh_ptr + offsets)))
    part = tl.dot(w, tl.trans(tl.load(xl_ptr + offsets)), part)
    return acc + part * tl.reshape(scale, (scale.shape[0],))[:, None]


@triton.jit
def _prototype(xh_ptr, xl_ptr, w_ptr, s_ptr, out_ptr, K: tl.constexpr, M: tl.constexpr,
              NW: tl.constexpr, NUM_STAGES: tl.constexpr):  # fmt: skip
    G: tl.constexpr = K // 32
    R: tl.constexpr = 16 * NW
    rows = tl.program_id(0) * R + tl.arange(0, R)
    m = tl.arange(0, M)
    acc = tl.zeros([R, M], tl.float32)
    for g0 in tl.range(0, G, 8, num_stages=NUM_STAGES):
        group = tl.arange(0, 8)[None, :, None]
        words = tl.load(w_ptr + rows[:, None, None] * (G * 4) + (g0 + group) * 4
                        + tl.arange(0, 4)[None, None, :])  # fmt: skip
        scales = tl.load(s_ptr + rows[:, None] * G + g0 + tl.arange(0, 8)[None, :])
        scales = ((scales.to(tl.int32) + 14) << 23).to(tl.float32, bitcast=True)
        w0, w1, w2, w3, w4, w5, w6, w7 = _split8(tl.permute(words, (0, 2, 1)))
        s0, s1, s2, s3, s4, s5, s6, s7 = _split8(tl.reshape(scales, (R, 1, 8)))
        x = m[:, None] * K + g0 * 32 + tl.arange(0, 32)[None, :]
        acc = _group_dot(acc, w0, s0, xh_ptr, xl_ptr, x)
        acc = _group_dot(acc, w1, s1, xh_ptr, xl_ptr, x + 32)
        acc = _group_dot(acc, w2, s2, xh_ptr, xl_ptr, x + 64)
        acc = _group_dot(acc, w3, s3, xh_ptr, xl_ptr, x + 96)
        acc = _group_dot(acc, w4, s4, xh_ptr, xl_ptr, x + 128)
        acc = _group_dot(acc, w5, s5, xh_ptr, xl_ptr, x + 160)
        acc = _group_dot(acc, w6, s6, xh_ptr, xl_ptr, x + 192)
        acc = _group_dot(acc, w7, s7, xh_ptr, xl_ptr, x + 224)
    tl.store(out_ptr + rows[:, None] * M + m[None, :], acc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--columns", default="8,16", help="token columns of the MMA tile")
    args = parser.parse_args()
    check_e5m2_registers()
    print("e5m2 registers: every e2m1 code of every element exact")
    import sass_counts

    for columns in map(int, args.columns.split(",")):
        weights_per_thread = 64 * 256 / 128  # 64 rows x 8 groups of 32 on 128 threads
        sass_counts.report(f"fp8 operands, {columns} token columns", compile_prototype(columns),
                           weights_per_thread)  # fmt: skip


if __name__ == "__main__":
    main()
