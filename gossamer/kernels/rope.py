"""Rotary embedding (half-split, GPT-OSS/NeoX style) fused with the paged KV-cache write.

`rope_and_write_kv` reads q, k, v straight out of the fused QKV projection's output (strided views,
no copies), rotates q and k in float32 with the cos/sin table, writes the rotated q to a fresh
[T, Hq, D] tensor and stores the rotated k and v at their cache slots: one launch and one pass over
the activations instead of three (rope, then a K/V scatter). One program handles one token, all of
its heads. Tokens whose slot is negative (padding) are rotated but not stored.

`rope` (the op interface's signature) and `write_kv` are the same kernel with parts switched off.
The pure-torch twins are TorchOps.rope / TorchOps.write_kv (gossamer/ops/torch_ref.py).

cos_sin: [max_pos, D] float32, cos in [:, :D/2], sin in [:, D/2:] (YaRN scaling folded in).
kv_cache: [2, num_blocks, block_size, Hkv, D], K at [0], V at [1]; a slot is block * block_size + offset.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gossamer.kernels import pdl
from gossamer.ops.torch_ref import TorchOps


@triton.jit
def _rotate_heads(
    src_ptr,
    dst_ptr,
    token,
    stride_src_token,
    stride_src_head,
    stride_dst_token,
    stride_dst_head,
    num_heads,
    cos,  # [1, HALF] float32
    sin,  # [1, HALF] float32
    store_heads,  # heads to store: num_heads, or 0 to skip the stores (negative slot)
    HALF: tl.constexpr,
    BLOCK_HEADS: tl.constexpr,
):
    heads = tl.arange(0, BLOCK_HEADS)[:, None]  # [BLOCK_HEADS, 1]
    dims = tl.arange(0, HALF)[None, :]  # [1, HALF]
    mask = heads < num_heads
    store_mask = heads < store_heads
    src = src_ptr + token * stride_src_token + heads * stride_src_head + dims
    first = tl.load(src, mask=mask, other=0.0)
    second = tl.load(src + HALF, mask=mask, other=0.0)
    x1, x2 = first.to(tl.float32), second.to(tl.float32)
    out1 = x1 * cos - x2 * sin
    out2 = x2 * cos + x1 * sin
    dst = dst_ptr + token * stride_dst_token + heads * stride_dst_head + dims
    # rounded to the source's dtype first: what the rope op returns, so a cache write in another
    # dtype (fp8) stores the bits of rope then write_kv
    dtype = dst_ptr.dtype.element_ty
    tl.store(dst, out1.to(first.dtype).to(dtype), mask=store_mask)
    tl.store(dst + HALF, out2.to(first.dtype).to(dtype), mask=store_mask)


@triton.jit
def _rope_kv_kernel(
    q_ptr,  # [T, Hq, D] (any token/head strides, unit stride along D)
    k_ptr,  # [T, Hkv, D]
    v_ptr,  # [T, Hkv, D]
    positions_ptr,  # [T] int
    cos_sin_ptr,  # [max_pos, D] float32
    q_out_ptr,  # [T, Hq, D]
    k_out_ptr,  # [T, Hkv, D] (only with STORE_K)
    cache_ptr,  # [2, num_slots, Hkv, D] (only with WRITE_KV)
    slot_mapping_ptr,  # [T] int64 (only with WRITE_KV)
    num_q_heads,
    num_kv_heads,
    stride_q_token,
    stride_q_head,
    stride_k_token,
    stride_k_head,
    stride_v_token,
    stride_v_head,
    stride_q_out_token,
    stride_q_out_head,
    stride_k_out_token,
    stride_k_out_head,
    stride_cache_kv,  # elements between the K and the V plane
    stride_cache_slot,
    stride_cache_head,
    stride_cos_sin,
    HALF: tl.constexpr,
    BLOCK_Q_HEADS: tl.constexpr,
    BLOCK_KV_HEADS: tl.constexpr,
    ROTATE: tl.constexpr,  # False: a plain K/V cache write
    STORE_K: tl.constexpr,  # store rotated k to k_out (the plain `rope`)
    WRITE_KV: tl.constexpr,  # store rotated k and v into the cache
    PDL: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pdl.wait(PDL)
    if ROTATE:
        position = tl.load(positions_ptr + token).to(tl.int64)
        dims = tl.arange(0, HALF)[None, :]
        cos = tl.load(cos_sin_ptr + position * stride_cos_sin + dims).to(tl.float32)
        sin = tl.load(cos_sin_ptr + position * stride_cos_sin + HALF + dims).to(tl.float32)
        _rotate_heads(
            q_ptr, q_out_ptr, token, stride_q_token, stride_q_head, stride_q_out_token,
            stride_q_out_head, num_q_heads, cos, sin, num_q_heads, HALF, BLOCK_Q_HEADS,
        )  # fmt: skip
        if STORE_K:
            _rotate_heads(
                k_ptr, k_out_ptr, token, stride_k_token, stride_k_head, stride_k_out_token,
                stride_k_out_head, num_kv_heads, cos, sin, num_kv_heads, HALF, BLOCK_KV_HEADS,
            )  # fmt: skip
    if WRITE_KV:
        slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
        # NOTE: a negative slot (padding) stores no head; the clamp keeps the masked addresses sane
        store_heads = tl.where(slot >= 0, num_kv_heads, 0)
        slot = tl.maximum(slot, 0)
        k_cache_ptr = cache_ptr + slot * stride_cache_slot
        if ROTATE:
            _rotate_heads(
                k_ptr, k_cache_ptr, token, stride_k_token, stride_k_head, 0, stride_cache_head,
                num_kv_heads, cos, sin, store_heads, HALF, BLOCK_KV_HEADS,
            )  # fmt: skip
        else:
            _copy_heads(
                k_ptr + token * stride_k_token, k_cache_ptr, stride_k_head, stride_cache_head,
                num_kv_heads, store_heads, 2 * HALF, BLOCK_KV_HEADS,
            )  # fmt: skip
        _copy_heads(
            v_ptr + token * stride_v_token, k_cache_ptr + stride_cache_kv, stride_v_head,
            stride_cache_head, num_kv_heads, store_heads, 2 * HALF, BLOCK_KV_HEADS,
        )  # fmt: skip


@triton.jit
def _copy_heads(
    src_ptr,
    dst_ptr,
    stride_src_head,
    stride_dst_head,
    num_heads,
    store_heads,  # num_heads, or 0 to skip the store
    HEAD_DIM: tl.constexpr,
    BLOCK_HEADS: tl.constexpr,
):
    heads = tl.arange(0, BLOCK_HEADS)[:, None]
    dims = tl.arange(0, HEAD_DIM)[None, :]
    values = tl.load(src_ptr + heads * stride_src_head + dims, mask=heads < num_heads, other=0.0)
    dst = dst_ptr + heads * stride_dst_head + dims
    tl.store(dst, values.to(dst_ptr.dtype.element_ty), mask=heads < store_heads)


def rope_and_write_kv(
    q: torch.Tensor,  # [T, Hq, D]
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,  # [T, Hkv, D]
    positions: torch.Tensor,  # [T] int
    cos_sin: torch.Tensor,  # [max_pos, D] float32
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, Hkv, D]
    slot_mapping: torch.Tensor,  # [T] int64, < 0: not stored
) -> torch.Tensor:
    """Rotate q and k, store rotated k and v at their slots; returns rotated q [T, Hq, D]."""
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    _launch(q, k, v, positions, cos_sin, q_out, None, kv_cache, slot_mapping)
    return q_out


def rope(
    q: torch.Tensor,  # [T, Hq, D]
    k: torch.Tensor,  # [T, Hkv, D]
    positions: torch.Tensor,  # [T] int
    cos_sin: torch.Tensor,  # [max_pos, D] float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """The op interface's rope: rotated copies of q and k."""
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    _launch(q, k, None, positions, cos_sin, q_out, k_out, None, None)
    return q_out, k_out


def write_kv(
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,  # [T, Hkv, D]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, Hkv, D]
    slot_mapping: torch.Tensor,  # [T] int64, < 0: not stored
) -> None:
    """The op interface's write_kv (no rotation), graph-capturable unlike the torch reference."""
    _launch(None, k, v, None, None, None, None, kv_cache, slot_mapping)


def rope_and_write_kv_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """The pure-torch twin: TorchOps.rope then TorchOps.write_kv."""
    return TorchOps().rope_and_write_kv(q, k, v, positions, cos_sin, kv_cache, slot_mapping)


def _launch(
    q: torch.Tensor | None,
    k: torch.Tensor,
    v: torch.Tensor | None,
    positions: torch.Tensor | None,
    cos_sin: torch.Tensor | None,
    q_out: torch.Tensor | None,
    k_out: torch.Tensor | None,
    kv_cache: torch.Tensor | None,
    slot_mapping: torch.Tensor | None,
) -> None:
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    if head_dim % 2 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim {head_dim} must be a power of two for the rope kernel")
    rotate = q is not None
    write = kv_cache is not None
    for name, t in (("q", q), ("k", k), ("v", v), ("q_out", q_out), ("k_out", k_out)):
        if t is not None and t.stride(-1) != 1:
            raise ValueError(f"{name} needs a unit stride along head_dim, got {t.stride()}")
    if write:
        _check_cache(kv_cache, num_kv_heads, head_dim)
        cache_strides = (kv_cache.stride(0), kv_cache.stride(2), kv_cache.stride(3))
    else:
        cache_strides = (0, 0, 0)
    num_q_heads = q.shape[1] if rotate else 1
    anchor = k  # a real tensor standing in for the pointers a variant does not use
    _rope_kv_kernel[(num_tokens,)](
        q if rotate else anchor,
        k,
        v if v is not None else anchor,
        positions if rotate else anchor,
        cos_sin if rotate else anchor,
        q_out if rotate else anchor,
        k_out if k_out is not None else anchor,
        kv_cache if write else anchor,
        slot_mapping if write else anchor,
        num_q_heads,
        num_kv_heads,
        *(q.stride()[:2] if rotate else (0, 0)),
        *k.stride()[:2],
        *(v.stride()[:2] if v is not None else (0, 0)),
        *(q_out.stride()[:2] if rotate else (0, 0)),
        *(k_out.stride()[:2] if k_out is not None else (0, 0)),
        *cache_strides,
        cos_sin.stride(0) if rotate else 0,
        HALF=head_dim // 2,
        BLOCK_Q_HEADS=triton.next_power_of_2(num_q_heads),
        BLOCK_KV_HEADS=triton.next_power_of_2(num_kv_heads),
        ROTATE=rotate,
        STORE_K=k_out is not None,
        WRITE_KV=write,
        num_warps=4,
        **pdl.launch_options(k.device),
    )


def _check_cache(kv_cache: torch.Tensor, num_kv_heads: int, head_dim: int) -> None:
    two, _, block_size, heads, dim = kv_cache.shape
    if two != 2 or heads != num_kv_heads or dim != head_dim:
        raise ValueError(
            f"kv_cache {tuple(kv_cache.shape)} does not fit k/v with {num_kv_heads} heads of "
            f"{head_dim}; expected [2, num_blocks, block_size, {num_kv_heads}, {head_dim}]"
        )
    # NOTE: the kernel addresses slot s as s * stride(2): blocks must be laid out back to back.
    if kv_cache.stride(1) != block_size * kv_cache.stride(2) or kv_cache.stride(4) != 1:
        raise ValueError(f"kv_cache strides {kv_cache.stride()} are not a flat slot layout")
