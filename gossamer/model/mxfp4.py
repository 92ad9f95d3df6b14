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
