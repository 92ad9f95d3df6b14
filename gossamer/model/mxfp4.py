"""MXFP4: the packed expert format of the published GPT-OSS checkpoints.

A block of 32 consecutive input elements shares one e8m0 scale (a biased power of two: 2^(s-127)); each
element is an e2m1 float (sign, 2 exponent bits, 1 mantissa bit: 0, .5, 1, 1.5, 2, 3, 4, 6) stored
in a nibble, two per byte, the low nibble holding the even element.
"""

from __future__ import annotations

import os

import torch

BLOCK = 32
E2M1_VALUES = (
    0.0,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    4.0,
    6.0,
    -0.0,
    -0.5,
    -1.0,
    -1.5,
    -2.0,
    -3.0,
    -4.0,
    -6.0,
)
E2M1_MAX = 6.0
SCALE_BIAS = 127
# The largest scale exponent the Triton kernels decode: weights below 2^65, so that the bf16 lanes'
# scale 2^(s-65) is finite and every product stays normal in fp32 (gossamer/kernels/moe_mxfp4.py).
# 255 is NaN in e8m0. The loader checks the experts against it (weights.check_expert_scales).
KERNEL_MAX_SCALE = 192


def dequantize(
    blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """blocks [..., G, 16] uint8 + scales [..., G] uint8 -> [..., G * 32] in `dtype`."""
    table = torch.tensor(E2M1_VALUES, dtype=dtype, device=blocks.device)
    low = table[(blocks & 0x0F).long()]
    high = table[(blocks >> 4).long()]
    values = torch.stack((low, high), dim=-1).flatten(-2)  # [..., G, 32]
    exponents = scales.to(torch.int32) - SCALE_BIAS
    values = torch.ldexp(values, exponents.unsqueeze(-1).to(values.device))
    return values.to(dtype).flatten(-2)


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [..., K] (K a multiple of 32) -> (blocks [..., K/32, 16] uint8, scales [..., K/32] uint8).

    The shared exponent is the smallest that brings the block's largest magnitude within e2m1's
    range (6), so nothing clips; elements round to the nearest e2m1 value (a tie goes to the smaller magnitude)."""
    if weight.shape[-1] % BLOCK:
        raise ValueError(f"MXFP4 needs the last dimension to be a multiple of {BLOCK}")
    grouped = weight.float().unflatten(-1, (-1, BLOCK))  # [..., G, 32]
    amax = grouped.abs().amax(dim=-1)
    exponent = torch.ceil(torch.log2(amax / E2M1_MAX)).clamp(-SCALE_BIAS, 127)
    exponent = torch.where(amax > 0, exponent, torch.zeros_like(exponent))
    scaled = grouped / torch.exp2(exponent).unsqueeze(-1)
    codes = _nearest_e2m1_code(scaled)  # [..., G, 32] uint8 in 0..15
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    scales = (exponent + SCALE_BIAS).to(torch.uint8)
    return packed.to(torch.uint8), scales


def _nearest_e2m1_code(x: torch.Tensor) -> torch.Tensor:
    magnitudes = torch.tensor(E2M1_VALUES[:8], dtype=torch.float32, device=x.device)
    distance = (x.abs().clamp(max=E2M1_MAX).unsqueeze(-1) - magnitudes).abs()  # [..., 8]
    # argmin takes the first minimum: a tie between two codes goes to the smaller magnitude.
    code = distance.argmin(dim=-1).to(torch.uint8)
    negative = (x < 0) & (code > 0)
    return torch.where(negative, code | 0x8, code)


# ----------------------------------------------------------------------------------------------
# The GPU layouts: the same bits, permuted within each 32-bit word for a cheaper unpack
# ----------------------------------------------------------------------------------------------
# A 32-bit word of a block holds elements 8q..8q+7 of its group, element c in nibble c (bits
# 4c..4c+3: magnitude in the low three, sign on top). Two kinds of kernel turn each word into four
# registers of two 16-bit lanes, register j holding elements j and j + 4: the batch-1 GEMVs into
# fp16 lanes (e2m1 * 2^-14: magnitude in bits 9..11 of a lane, sign in bit 15), the grouped v2
# kernel into bf16 lanes (e2m1 * 2^-126: magnitude in bits 6..8). From the published layout each
# register costs four instructions (two shifts, two masks). FP16_LANES moves each element's bits
# so that the fp16 unpack takes 9 instructions a word (register 0 one mask, register 1 one shift
# and a mask, registers 2 and 3 a mask, a multiply adding two shifted copies that never carry into
# kept bits, and a mask) and the bf16 one 12. The LANES_F_B layouts trade the other way: F
# instructions a word for fp16 lanes, B for bf16 ones (the Pareto front of such placements,
# `benchmarks/unpack_layouts.py`); the kernels unpack them with recipes that script writes
# (`moe_mxfp4._layout_lanes`). Only the Triton kernels read these; the loader repacks on the GPU.
LAYOUT_HF = "hf"
LAYOUT_FP16_LANES = "fp16_lanes"
LAYOUT_LANES_12_10 = "lanes_12_10"
LAYOUT_LANES_13_9 = "lanes_13_9"
LAYOUT_LANES_16_8 = "lanes_16_8"
# Per register j: the bits (m0, e0, e1, sign) of element j; element j + 4's sit 16 bits higher,
# mod 32 (a layout may keep an element's bit in either half of the word).
LANE_LAYOUTS = {
    LAYOUT_FP16_LANES: ((9, 10, 11, 15), (6, 7, 8, 12), (3, 4, 5, 14), (0, 1, 2, 13)),
    LAYOUT_LANES_12_10: ((0, 1, 2, 13), (3, 4, 5, 12), (6, 7, 8, 15), (9, 10, 11, 14)),
    LAYOUT_LANES_13_9: ((30, 31, 0, 7), (3, 1, 8, 12), (9, 10, 11, 18), (4, 5, 6, 13)),
    LAYOUT_LANES_16_8: ((3, 4, 0, 1), (9, 10, 11, 18), (28, 29, 30, 5), (6, 7, 8, 15)),
}
LAYOUTS = (LAYOUT_HF, *LANE_LAYOUTS)
# (lowest magnitude bit, sign bit) in the low half-word of element j; element j + 4 sits 16 above.
FP16_LANE_BITS = tuple((bits[0], bits[3]) for bits in LANE_LAYOUTS[LAYOUT_FP16_LANES])


def gpu_layout() -> str:
    """The layout the loader repacks the experts to for the Triton ops on the GPU:
    GOSSAMER_MXFP4_LAYOUT (one of LAYOUTS; "hf" keeps the published one), FP16_LANES by default."""
    layout = os.environ.get("GOSSAMER_MXFP4_LAYOUT", LAYOUT_FP16_LANES)
    if layout not in LAYOUTS:
        raise ValueError(f"GOSSAMER_MXFP4_LAYOUT={layout!r} is not one of {', '.join(LAYOUTS)}")
    return layout


def element_bits(layout: str, element: int) -> tuple[int, ...]:
    """Where `layout` keeps element `element` (0..7) of a word: the bit positions of its (m0, e0,
    e1, sign), i.e. of the published nibble's bits 0..3."""
    if layout == LAYOUT_HF:
        return tuple(4 * element + bit for bit in range(4))
    if layout not in LANE_LAYOUTS:
        raise ValueError(f"unknown MXFP4 layout {layout!r}; known: {', '.join(LAYOUTS)}")
    return tuple((bit + 16 * (element // 4)) % 32 for bit in LANE_LAYOUTS[layout][element % 4])


def repack(blocks: torch.Tensor, source: str, target: str) -> torch.Tensor:
    """Blocks [..., 16] uint8 in layout `source` -> the same values in layout `target` (a bit
    permutation of each word), in chunks of CHUNK_WORDS words so that the int64 temporaries stay
    small."""
    if blocks.dtype != torch.uint8 or blocks.shape[-1] % 4:
        raise ValueError("expected uint8 MXFP4 blocks whose last dimension is a multiple of 4")
    moves = [
        pair
        for element in range(8)
        for pair in zip(element_bits(source, element), element_bits(target, element), strict=True)
    ]
    words = blocks.contiguous().view(torch.int32).flatten()
    out = torch.empty_like(words)
    for start in range(0, words.numel(), CHUNK_WORDS):
        chunk = words[start : start + CHUNK_WORDS].to(torch.int64) & 0xFFFFFFFF
        out[start : start + CHUNK_WORDS] = _move_bits(chunk, moves)
    return out.view(torch.uint8).view(blocks.shape)


CHUNK_WORDS = 1 << 26


def _move_bits(words: torch.Tensor, moves: list[tuple[int, int]]) -> torch.Tensor:
    """int64 words holding 32 bits -> int32 words with bit s moved to bit t for each (s, t): one
    mask and shift for all bits that move the same distance."""
    sources_by_shift: dict[int, int] = {}
    for source, target in moves:
        sources_by_shift[target - source] = sources_by_shift.get(target - source, 0) | 1 << source
    moved = torch.zeros_like(words)
    for shift, sources in sources_by_shift.items():
        part = words & sources
        moved |= part << shift if shift >= 0 else part >> -shift
    return torch.where(moved >= 2**31, moved - 2**32, moved).to(torch.int32)


def to_fp16_lanes(blocks: torch.Tensor) -> torch.Tensor:
    """Published-layout blocks [..., 16] uint8 -> the same values in LAYOUT_FP16_LANES."""
    return repack(blocks, LAYOUT_HF, LAYOUT_FP16_LANES)


def from_fp16_lanes(blocks: torch.Tensor) -> torch.Tensor:
    """The inverse of `to_fp16_lanes`."""
    return repack(blocks, LAYOUT_FP16_LANES, LAYOUT_HF)
