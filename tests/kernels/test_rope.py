"""Rotary embedding fused with the KV-cache write (gossamer/kernels/rope.py) against TorchOps.

q, k, v are the strided views of one fused QKV output, exactly as the model hands them over. Every
cache slot starts as a distinct random value, so a write to a wrong slot, a missed write, or a write
for a padded token (slot -1) changes the cache and fails the bit-for-bit comparison.
"""

from __future__ import annotations

import pytest
import torch

from gossamer.ops.torch_ref import TorchOps
from tests.kernels.interpreted import DEVICE, kernel_fixture

rope = kernel_fixture("rope")


def _qkv(tokens: int, q_heads: int, kv_heads: int, dim: int, dtype: torch.dtype, device=DEVICE):
    qkv = torch.randn(tokens, (q_heads + 2 * kv_heads) * dim, device=device).to(dtype)
    q, k, v = qkv.split([q_heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    return (
        q.view(tokens, q_heads, dim),
        k.view(tokens, kv_heads, dim),
        v.view(tokens, kv_heads, dim),
    )


def _table(max_pos: int, dim: int, device=DEVICE) -> torch.Tensor:
    """A cos/sin-shaped table with unrelated halves, so swapping cos and sin is caught."""
    angles = torch.rand(max_pos, dim // 2, device=device) * 6.3
    return torch.cat((1.3 * angles.cos(), 1.3 * angles.sin()), dim=-1)


def _tolerance(dtype: torch.dtype) -> dict[str, float]:
    # float32 math on both sides; a fused multiply-add may differ in the last float32 bit, which
    # can move a float16 result by one ulp
    return dict(atol=1e-6, rtol=1e-6) if dtype == torch.float32 else dict(atol=1e-3, rtol=1e-3)


def _cache(blocks: int, block_size: int, kv_heads: int, dim: int, dtype, device=DEVICE):
    return torch.randn(2, blocks, block_size, kv_heads, dim, device=device).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("q_heads,kv_heads,dim", [(4, 2, 16), (6, 3, 32), (2, 1, 8)])
def test_fused_rope_and_kv_write_match_rope_then_write(rope, dtype, q_heads, kv_heads, dim):
    tokens, block_size = 7, 4
    q, k, v = _qkv(tokens, q_heads, kv_heads, dim, dtype)
    positions = torch.tensor([0, 5, 6, 7, 19, 3, 11], device=DEVICE)
    slots = torch.tensor([9, -1, 0, 15, 4, 2, -1], device=DEVICE)  # -1: padding, nothing stored
    cos_sin = _table(20, dim)
    cache = _cache(4, block_size, kv_heads, dim, dtype)
    expected_cache = cache.clone()
    q_rot = rope.rope_and_write_kv(q, k, v, positions, cos_sin, cache, slots)
    expected_q = TorchOps().rope_and_write_kv(q, k, v, positions, cos_sin, expected_cache, slots)
    assert q_rot.shape == (tokens, q_heads, dim) and q_rot.is_contiguous()
    torch.testing.assert_close(q_rot, expected_q, **_tolerance(dtype))
    torch.testing.assert_close(cache, expected_cache, **_tolerance(dtype))


@pytest.mark.parametrize("positions_dtype", [torch.int32, torch.int64])
def test_plain_rope_matches_reference(rope, positions_dtype):
    q, k, _ = _qkv(5, 4, 2, 16, torch.float32)
    positions = torch.tensor([3, 0, 9, 9, 1], dtype=positions_dtype, device=DEVICE)
    cos_sin = _table(10, 16)
    q_rot, k_rot = rope.rope(q, k, positions, cos_sin)
    ref_q, ref_k = TorchOps().rope(q, k, positions, cos_sin)
    torch.testing.assert_close(q_rot, ref_q, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(k_rot, ref_k, atol=1e-6, rtol=1e-6)
    assert not torch.equal(q_rot, q)  # it did rotate


def test_plain_write_kv_matches_reference(rope):
    _, k, v = _qkv(6, 4, 2, 16, torch.float16)
    slots = torch.tensor([-1, 3, 8, 1, 0, 14], device=DEVICE)
    cache = _cache(4, 4, 2, 16, torch.float16)
    expected = cache.clone()
    rope.write_kv(k, v, cache, slots)
    TorchOps().write_kv(k, v, expected, slots)
    assert torch.equal(cache, expected)


def test_write_converts_to_the_cache_dtype(rope):
    q, k, v = _qkv(3, 2, 1, 16, torch.float32)
    cache = _cache(2, 4, 1, 16, torch.float16)
    expected = cache.clone()
    positions = torch.tensor([1, 2, 3], device=DEVICE)
    slots, cos_sin = torch.tensor([0, 5, 7], device=DEVICE), _table(4, 16)
    rope.rope_and_write_kv(q, k, v, positions, cos_sin, cache, slots)
    TorchOps().rope_and_write_kv(q, k, v, positions, cos_sin, expected, slots)
    torch.testing.assert_close(cache, expected, atol=1e-3, rtol=1e-3)


def test_layer_view_of_a_multi_layer_cache(rope):
    """The model passes kv_cache[layer_index]: a view into the middle of the full cache."""
    q, k, v = _qkv(4, 4, 2, 16, torch.float32)
    full = torch.randn(3, 2, 4, 4, 2, 16, device=DEVICE)
    expected = full.clone()
    positions = torch.arange(4, device=DEVICE)
    slots, cos_sin = torch.tensor([4, 5, 6, 15], device=DEVICE), _table(4, 16)
    rope.rope_and_write_kv(q, k, v, positions, cos_sin, full[1], slots)
    TorchOps().rope_and_write_kv(q, k, v, positions, cos_sin, expected[1], slots)
    torch.testing.assert_close(full, expected, atol=1e-6, rtol=1e-6)


def test_rejects_a_cache_that_does_not_fit(rope):
    q, k, v = _qkv(2, 4, 2, 16, torch.float32)
    with pytest.raises(ValueError, match="does not fit"):
        rope.rope_and_write_kv(
            q, k, v, torch.arange(2, device=DEVICE), _table(2, 16),
            _cache(2, 4, 3, 16, torch.float32), torch.arange(2, device=DEVICE),
        )  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 3, 64, 2048])
def test_gpu_gpt_oss_120b_shapes_bf16(tokens):
    from gossamer.kernels import rope as compiled
    from gossamer.model.rope import cos_sin_table
    from gossamer.presets import preset

    config = preset("gpt-oss-120b")
    q, k, v = _qkv(tokens, 64, 8, 64, torch.bfloat16, device="cuda")
    cos_sin = cos_sin_table(config, 8192, "cuda")
    positions = torch.randint(0, 8192, (tokens,), device="cuda")
    blocks = tokens // 16 + 8
    slots = torch.randperm(blocks * 16, device="cuda")[:tokens]
    slots[::3] = -1
    cache = _cache(blocks, 16, 8, 64, torch.bfloat16, device="cuda")
    expected = cache.clone()
    q_rot = compiled.rope_and_write_kv(q, k, v, positions, cos_sin, cache, slots)
    expected_q = TorchOps().rope_and_write_kv(q, k, v, positions, cos_sin, expected, slots)
    # float32 math on both sides; an FMA may move a value across a bf16 rounding edge
    torch.testing.assert_close(q_rot, expected_q, atol=1e-2, rtol=8e-3)
    torch.testing.assert_close(cache, expected, atol=1e-2, rtol=8e-3)
    assert (q_rot != expected_q).float().mean() < 0.01
