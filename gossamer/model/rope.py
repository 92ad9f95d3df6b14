"""YaRN rotary embedding as GPT-OSS uses it: NTK-by-parts frequency blend plus the attention
"concentration" factor 0.1 * ln(factor) + 1 folded into cos and sin (so q.k scales by its square)."""

from __future__ import annotations

import math

import torch

from gossamer.config import ModelConfig


def inverse_frequencies(config: ModelConfig) -> tuple[torch.Tensor, float]:
    """([head_dim/2] float32 inverse frequencies, attention scaling factor)."""
    dim = config.head_dim
    base = config.rope_theta
    exponents = torch.arange(0, dim, 2, dtype=torch.float32) / dim
    pos_freqs = base**exponents
    extrapolation = 1.0 / pos_freqs
    rope = config.rope_scaling
    if rope is None:
        return extrapolation, 1.0
    interpolation = 1.0 / (rope.factor * pos_freqs)
    low, high = _correction_range(rope.beta_fast, rope.beta_slow, dim, base, rope)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    # Fast-rotating dimensions (ramp 0) keep their frequency; slow ones (ramp 1) are interpolated.
    inv_freq = interpolation * ramp + extrapolation * (1 - ramp)
    scaling = 0.1 * math.log(rope.factor) + 1.0 if rope.factor > 1 else 1.0
    return inv_freq, scaling


def _correction_range(
    beta_fast: float, beta_slow: float, dim: int, base: float, rope
) -> tuple[float, float]:
    def dim_for_rotations(rotations: float) -> float:
        wavelength_count = rope.original_max_position_embeddings / (rotations * 2 * math.pi)
        return dim * math.log(wavelength_count) / (2 * math.log(base))

    low, high = dim_for_rotations(beta_fast), dim_for_rotations(beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def cos_sin_table(
    config: ModelConfig, max_positions: int, device: torch.device | str
) -> torch.Tensor:
    """[max_positions, head_dim] float32: cos in the first half, sin in the second, both scaled."""
    inv_freq, scaling = inverse_frequencies(config)
    positions = torch.arange(max_positions, dtype=torch.float32)
    angles = positions[:, None] * inv_freq[None, :]
    table = torch.cat((angles.cos() * scaling, angles.sin() * scaling), dim=-1)
    return table.to(device)
