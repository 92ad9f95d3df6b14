"""MXFP4: the packed expert format of the published GPT-OSS checkpoints.

A block of 32 consecutive input elements shares one e8m0 scale (a biased power of two: 2^(s-127)); each
element is an e2m1 float (sign, 2 exponent bits, 1 mantissa bit: 0, .5, 1, 1.5, 2, 3, 4, 6) stored
in a nibble, two per byte, the low nibble holding the even element.
"""

from __future__ import annotations

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
# The GPU layout: the same bits, permuted within each 32-bit word for a cheaper unpack
# ----------------------------------------------------------------------------------------------
# A 32-bit word of a block holds elements 8q..8q+7 of its group, element c in nibble c (bits
# 4c..4c+3: magnitude in the low three, sign on top). The packed-fp16 MoE GEMV turns each word
# into four registers of two fp16 lanes, register j holding elements j and j + 4 as e2m1 * 2^-14:
# magnitude in bits 9..11 of a lane, sign in bit 15. From the published layout that costs four
# instructions per register (two shifts, two masks). FP16_LANES moves each element's bits so that
# register 0 is one mask, register 1 one shift and a mask, and registers 2 and 3 a mask, a
# multiply (two shifted copies that never carry into kept bits) and a mask: 9 instructions per
# word instead of 16 (the grouped v2 kernel's bf16 unpack stays at 13). Found by an exhaustive
# search over such placements. Only the Triton kernels read it; the loader repacks on the GPU.
LAYOUT_HF = "hf"
LAYOUT_FP16_LANES = "fp16_lanes"
# The loader repacks for the Triton ops on the GPU when this is on (benchmarks turn it off for A/B).
REPACK_FOR_GPU = True
# (lowest magnitude bit, sign bit) in the low half-word of element j; element j + 4 sits 16 above.
FP16_LANE_BITS = ((9, 15), (6, 12), (3, 14), (0, 13))


def _permute_words(blocks: torch.Tensor, to_gpu: bool) -> torch.Tensor:
    """Move every element's magnitude and sign bits between the two layouts, in chunks of
    CHUNK_WORDS words so that the int64 temporaries stay small."""
    if blocks.dtype != torch.uint8 or blocks.shape[-1] % 4:
        raise ValueError("expected uint8 MXFP4 blocks whose last dimension is a multiple of 4")
    words = blocks.contiguous().view(torch.int32).flatten()
    out = torch.empty_like(words)
    for start in range(0, words.numel(), CHUNK_WORDS):
        chunk = words[start : start + CHUNK_WORDS].to(torch.int64) & 0xFFFFFFFF
        out[start : start + CHUNK_WORDS] = _move_bits(chunk, to_gpu)
    return out.view(torch.uint8).view(blocks.shape)


CHUNK_WORDS = 1 << 26


def _move_bits(words: torch.Tensor, to_gpu: bool) -> torch.Tensor:
    """int64 words holding 32 bits -> int32 words with each element's bits moved."""
    moved = torch.zeros_like(words)
    for element in range(8):
        lane = 16 * (element // 4)
        mag_at, sign_at = FP16_LANE_BITS[element % 4]
        pairs = ((4 * element, mag_at + lane, 0x7), (4 * element + 3, sign_at + lane, 0x1))
        for hf_bit, gpu_bit, mask in pairs:
            source, target = (hf_bit, gpu_bit) if to_gpu else (gpu_bit, hf_bit)
            moved |= ((words >> source) & mask) << target
    return torch.where(moved >= 2**31, moved - 2**32, moved).to(torch.int32)


def to_fp16_lanes(blocks: torch.Tensor) -> torch.Tensor:
    """Published-layout blocks [..., 16] uint8 -> the same values in LAYOUT_FP16_LANES."""
    return _permute_words(blocks, to_gpu=True)


def from_fp16_lanes(blocks: torch.Tensor) -> torch.Tensor:
    """The inverse of `to_fp16_lanes`."""
    return _permute_words(blocks, to_gpu=False)
