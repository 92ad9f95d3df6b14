"""Linear layers for decode-sized batches: y[M, N] = x[M, K] @ W[N, K].T + bias, M = 1..16.

At decode every dense projection is a matrix-vector product bound by reading W once. Two kernels:

* M == 1 (`_gemv_kernel`): each program owns BLOCK_N rows of W and walks K in BLOCK_K chunks with
  16-byte loads along the rows, keeping a [BLOCK_N, BLOCK_K] float32 partial product in registers and
  reducing it once at the end (no per-step shuffles).
* 2 <= M <= 16 (`_small_m_kernel`): the same tiling through `tl.dot` on a 16-row tile, so W is
  still read once for all M rows.

When the rows alone do not fill the GPU (router: 128 or 32 rows; QKV/O: a few hundred row blocks)
K is split over split_k programs that write float32 partials, and `_reduce_splits_kernel` sums them,
adds the bias and casts (deterministic, no atomics). Above GEMV_MAX_M rows the call goes to cuBLAS.

The pure-torch twin is torch.nn.functional.linear.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

# Largest M served by the Triton kernels; above it, cuBLAS. Set from benchmarks/kernels_small.py:
# on the H200 (2026-12-02) cuBLAS beat these kernels on QKV (10.6 vs 17 us) and O (11.4 vs 15.7 us)
# at M=1 and tied elsewhere, so 0 = always cuBLAS until the kernels improve.
GEMV_MAX_M = 0
SMALL_M_TILE = 16  # tl.dot's row tile (its minimum)
WAVES = 4  # aim for this many programs per SM so that every SM keeps loads in flight


@triton.jit
def _gemv_kernel(
    x_ptr,  # [1, K]
    w_ptr,  # [N, K]
    bias_ptr,  # [N]
    out_ptr,  # [1, N] (not SPLIT)
    partial_ptr,  # [splits, 1, N] float32 (SPLIT)
    N,
    K,
    stride_w,
    k_per_split,  # a multiple of BLOCK_K
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,  # K is split over grid axis 1: write float32 partial sums
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_w  # [BLOCK_N, 1]
    k_begin = pid_k * k_per_split
    num_steps = (tl.minimum(K - k_begin, k_per_split) + BLOCK_K - 1) // BLOCK_K
    acc = tl.full([BLOCK_N, BLOCK_K], 0.0, tl.float32)
    for step in range(num_steps):
        cols = k_begin + step * BLOCK_K + tl.arange(0, BLOCK_K)
        cols = tl.max_contiguous(tl.multiple_of(cols, BLOCK_K), BLOCK_K)
        col_mask = cols < K
        mask = row_mask[:, None] & col_mask[None, :]
        w = tl.load(w_rows + cols[None, :], mask=mask, other=0.0)
        # NOTE: x is read through a [BLOCK_N, BLOCK_K] pointer block with a zero row stride, so it
        # gets W's register layout (16-byte loads, repeats served by L1) instead of a per-step
        # shuffle through shared memory behind a barrier.
        x = tl.load(x_ptr + (rows * 0)[:, None] + cols[None, :], mask=mask, other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)
    y = tl.sum(acc, axis=1)  # [BLOCK_N]
    _finish(y[None, :], tl.arange(0, 1), rows, 1, N, bias_ptr, out_ptr, partial_ptr, pid_k,
            N, HAS_BIAS, SPLIT)  # fmt: skip


@triton.jit
def _small_m_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K]
    bias_ptr,  # [N]
    out_ptr,  # [M, N] (not SPLIT)
    partial_ptr,  # [splits, M, N] float32 (SPLIT)
    M,
    N,
    K,
    stride_x,
    stride_w,
    stride_out,
    k_per_split,  # a multiple of BLOCK_K
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
    IEEE_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    tokens = tl.arange(0, BLOCK_M)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    token_mask = tokens < M
    row_mask = rows < N
    x_rows = x_ptr + tokens.to(tl.int64)[:, None] * stride_x  # [BLOCK_M, 1]
    w_rows = w_ptr + rows.to(tl.int64)[None, :] * stride_w  # [1, BLOCK_N]
    k_begin = pid_k * k_per_split
    num_steps = (tl.minimum(K - k_begin, k_per_split) + BLOCK_K - 1) // BLOCK_K
    acc = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
    for step in range(num_steps):
        cols = k_begin + step * BLOCK_K + tl.arange(0, BLOCK_K)
        cols = tl.max_contiguous(tl.multiple_of(cols, BLOCK_K), BLOCK_K)
        col_mask = cols < K
        x = tl.load(x_rows + cols[None, :], mask=token_mask[:, None] & col_mask[None, :], other=0.0)
        # W^T tile [BLOCK_K, BLOCK_N], contiguous along K: 16-byte loads down each row of W
        w = tl.load(w_rows + cols[:, None], mask=col_mask[:, None] & row_mask[None, :], other=0.0)
        if IEEE_FP32:
            acc = tl.dot(x, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(x, w, acc)
    _finish(acc, tokens, rows, M, N, bias_ptr, out_ptr, partial_ptr, pid_k, stride_out,
            HAS_BIAS, SPLIT)  # fmt: skip


@triton.jit
def _finish(
    acc,  # [BLOCK_M, BLOCK_N] float32
    tokens,  # [BLOCK_M]
    rows,  # [BLOCK_N]
    M,
    N,
    bias_ptr,
    out_ptr,
    partial_ptr,
    pid_k,
    stride_out,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
):
    mask = (tokens[:, None] < M) & (rows[None, :] < N)
    if not SPLIT:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)[None, :]
        out = out_ptr + tokens[:, None] * stride_out + rows[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        partial = partial_ptr + (pid_k * M + tokens[:, None]) * N + rows[None, :]
        tl.store(partial, acc, mask=mask)


@triton.jit
def _reduce_splits_kernel(
    partial_ptr,  # [num_splits, M, N] float32
    bias_ptr,  # [N]
    out_ptr,  # [M, N]
    M,
    N,
    stride_out,
    num_splits,
    HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    token = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    acc = tl.full([BLOCK], 0.0, tl.float32)
    for split in range(num_splits):
        acc += tl.load(partial_ptr + (split * M + token) * N + cols, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + token * stride_out + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., K] @ weight[N, K].T + bias -> [..., N]: Triton for up to GEMV_MAX_M rows, else cuBLAS."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if rows == 0 or rows > GEMV_MAX_M or x.dtype != weight.dtype:
        return F.linear(x, weight, bias)
    return gemv(x, weight, bias)


def gemv(
    x: torch.Tensor,  # [..., K], at most SMALL_M_TILE rows
    weight: torch.Tensor,  # [N, K]
    bias: torch.Tensor | None,  # [N]
    plan: GemvPlan | None = None,  # tiling override (benchmarks); default plan_gemv(...)
) -> torch.Tensor:
    """The Triton path of `linear` (any M up to 16), output in x.dtype."""
    in_features = x.shape[-1]
    out_features = weight.shape[0]
    x2d = x.reshape(-1, in_features)
    num_tokens = x2d.shape[0]
    if num_tokens > SMALL_M_TILE:
        raise ValueError(f"gemv serves at most {SMALL_M_TILE} rows, got {num_tokens}")
    if weight.shape[1] != in_features:
        raise ValueError(f"x has {in_features} features but weight is {tuple(weight.shape)}")
    if x2d.stride(-1) != 1:
        x2d = x2d.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    out = torch.empty((num_tokens, out_features), dtype=x.dtype, device=x.device)
    if plan is None:
        plan = plan_gemv(num_tokens, out_features, in_features, _num_sms(x.device))
    partial = None
    if plan.split_k > 1:
        # [split_k, M, N] float32 partial sums, summed by _reduce_splits_kernel
        partial = torch.empty(
            (plan.split_k, num_tokens, out_features), dtype=torch.float32, device=x.device
        )
    grid = (triton.cdiv(out_features, plan.block_n), plan.split_k)
    has_bias = bias is not None
    bias_arg = bias if has_bias else weight
    partial_arg = partial if partial is not None else out
    if num_tokens == 1:
        _gemv_kernel[grid](
            x2d, weight, bias_arg, out, partial_arg, out_features, in_features, weight.stride(0),
            plan.k_per_split, HAS_BIAS=has_bias, SPLIT=plan.split_k > 1, BLOCK_N=plan.block_n,
            BLOCK_K=plan.block_k, num_warps=4,
        )  # fmt: skip
    else:
        _small_m_kernel[grid](
            x2d, weight, bias_arg, out, partial_arg, num_tokens, out_features, in_features,
            x2d.stride(0), weight.stride(0), out.stride(0), plan.k_per_split, HAS_BIAS=has_bias,
            SPLIT=plan.split_k > 1, IEEE_FP32=x.dtype == torch.float32, BLOCK_M=SMALL_M_TILE,
            BLOCK_N=plan.block_n, BLOCK_K=plan.block_k, num_warps=4, num_stages=4,
        )  # fmt: skip
    if partial is not None:
        block = 1024
        _reduce_splits_kernel[(num_tokens, triton.cdiv(out_features, block))](
            partial, bias_arg, out, num_tokens, out_features, out.stride(0), plan.split_k,
            HAS_BIAS=has_bias, BLOCK=block, num_warps=4,
        )  # fmt: skip
    return out.view(*x.shape[:-1], out_features)


@dataclass(frozen=True)
class GemvPlan:
    """Tiling of one (M, N, K) problem; a pure function of the shape (graph-capture safe)."""

    block_n: int  # rows of W per program
    block_k: int  # columns per step
    split_k: int  # programs sharing one row block's K range
    k_per_split: int  # columns per split, a multiple of block_k


@functools.lru_cache(maxsize=256)
def plan_gemv(
    num_tokens: int,
    out_features: int,
    in_features: int,
    num_sms: int,
    block_n: int | None = None,
    block_k: int = 128,
) -> GemvPlan:
    """Rows per program and K splits: enough programs for WAVES per SM, each reading >= 2 chunks.
    block_n / block_k override the tile (benchmarks sweep them)."""
    if block_n is None and num_tokens == 1:
        block_n = 16  # [16, 128] tile: 2 16-byte loads of W (and 2 of x) per thread per step
    elif block_n is None:
        block_n = 32 if out_features >= 32 * WAVES * num_sms else 16
    row_blocks = triton.cdiv(out_features, block_n)
    k_chunks = triton.cdiv(in_features, block_k)
    wanted = triton.cdiv(WAVES * num_sms, row_blocks)
    split_k = max(1, min(wanted, k_chunks // 2, 32))
    chunks_per_split = triton.cdiv(k_chunks, split_k)
    split_k = triton.cdiv(k_chunks, chunks_per_split)  # drop splits that would get no chunk
    return GemvPlan(block_n, block_k, split_k, chunks_per_split * block_k)


@functools.lru_cache(maxsize=8)
def _num_sms_cached(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: a small number still exercises the split-K path
    return _num_sms_cached(
        device.index if device.index is not None else torch.cuda.current_device()
    )
