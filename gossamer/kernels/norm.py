"""Fused residual add + RMSNorm.

One program per token row: read x (and the residual), write the new residual stream h = x + residual
(rounded to x.dtype, as torch's add would) and rms_norm(h) * weight, all in float32 arithmetic.
At decode a row is 2880 bf16 values, so the kernel is a single launch that is latency bound; fusing
the add saves one launch and one round trip of the hidden state per norm (two norms per layer).

Semantics are exactly `TorchOps.rms_norm` (gossamer/ops/torch_ref.py), which is also the pure-torch
twin used by the tests.

`rms_norm_planes` also writes the normed rows as the MXFP4 decode GEMV's fp16 input (moe_mxfp4's
pair planes scaled into fp16's range, as its routing kernel would write them), so that at decode the
post-attention norm feeds both the router and the experts and no routing kernel runs between the
router and the experts (moe_mxfp4.ROUTE_IN_EXPERTS).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gossamer.kernels import pdl
from gossamer.kernels.moe_mxfp4 import _store_fp16_planes
from gossamer.ops.torch_ref import TorchOps


@triton.jit
def _rms_norm_kernel(
    x_ptr,  # [T, H]
    residual_ptr,  # [T, H] (unused without HAS_RESIDUAL)
    weight_ptr,  # [H] float32
    out_ptr,  # [T, H] normed, x.dtype
    hidden_out_ptr,  # [T, H] x + residual, x.dtype (unused without HAS_RESIDUAL)
    hidden_size,
    stride_x,
    stride_residual,
    stride_out,
    stride_hidden_out,
    eps,
    planes_ptr,  # [T, H] fp16 out: the normed rows as moe_mxfp4's pair planes (PLANES_H > 0)
    unscale_ptr,  # [T] fp32 out: their 2^-e (PLANES_H > 0)
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PDL: tl.constexpr,
    PLANES_H: tl.constexpr = 0,  # the hidden size, when the planes are wanted
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    mask = cols < hidden_size
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)  # before the wait
    pdl.wait(PDL)
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * stride_residual + cols, mask=mask, other=0.0)
        # NOTE: round the sum to the activation dtype before normalising, as `x + residual` does
        # in torch; the rounded sum is also the residual stream the next layer adds to.
        hidden = (x.to(tl.float32) + residual.to(tl.float32)).to(x.dtype)
        tl.store(hidden_out_ptr + row * stride_hidden_out + cols, hidden, mask=mask)
    else:
        hidden = x
    h32 = hidden.to(tl.float32)
    mean_square = tl.sum(h32 * h32, axis=0) / hidden_size
    normed = (weight * (h32 * tl.rsqrt(mean_square + eps))).to(x.dtype)
    tl.store(out_ptr + row * stride_out + cols, normed, mask=mask)
    if PLANES_H > 0:  # the stored values, as the routing kernel would read them back
        _store_fp16_planes(normed.to(tl.float32), cols, planes_ptr + row * PLANES_H,
                           unscale_ptr + row, PLANES_H)  # fmt: skip


def rms_norm(
    x: torch.Tensor,  # [T, H]
    weight: torch.Tensor,  # [H]
    eps: float,
    residual: torch.Tensor | None = None,  # [T, H]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual) * weight, x + residual); without a residual (normed, x)."""
    normed, new_residual, _ = _launch(x, weight, eps, residual, planes=False)
    return normed, new_residual


def rms_norm_planes(
    x: torch.Tensor,  # [T, H]
    weight: torch.Tensor,  # [H]
    eps: float,
    residual: torch.Tensor | None = None,  # [T, H]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`rms_norm` plus the normed rows as the MXFP4 decode GEMV's input: (normed, new residual,
    x_h [T, H] fp16 pair planes scaled by 2^e_t, x_unscale [T] fp32 2^-e_t), x_h and x_unscale
    as moe_mxfp4.route_fp16(logits, k, normed) writes them."""
    if x.shape[-1] % 8:
        raise ValueError(f"the pair planes need a hidden size divisible by 8, got {x.shape[-1]}")
    normed, new_residual, planes = _launch(x, weight, eps, residual, planes=True)
    return normed, new_residual, *planes


def _launch(x, weight, eps, residual, planes: bool):
    hidden_size = x.shape[-1]
    x2d = _rows(x)
    out = torch.empty_like(x2d)
    if residual is not None:
        residual2d = _rows(residual)
        hidden_out = torch.empty_like(x2d)
    else:
        residual2d, hidden_out = x2d, out  # placeholders, never read or written
    num_rows = x2d.shape[0]
    x_h = unscale = out  # placeholders without planes
    if planes:
        x_h = torch.empty(num_rows, hidden_size, dtype=torch.float16, device=x.device)
        unscale = torch.empty(num_rows, dtype=torch.float32, device=x.device)
    if num_rows > 0:
        block = triton.next_power_of_2(hidden_size)
        _rms_norm_kernel[(num_rows,)](
            x2d,
            residual2d,
            weight,
            out,
            hidden_out,
            hidden_size,
            x2d.stride(0),
            residual2d.stride(0),
            out.stride(0),
            hidden_out.stride(0),
            eps,
            x_h,
            unscale,
            HAS_RESIDUAL=residual is not None,
            BLOCK_H=block,
            PLANES_H=hidden_size if planes else 0,
            num_warps=NUM_WARPS or _num_warps(block),
            **pdl.launch_options(x.device),
        )
    out = out.view(x.shape)
    new_residual = x if residual is None else hidden_out.view(x.shape)
    return out, new_residual, (x_h, unscale) if planes else None


def rms_norm_reference(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pure-torch twin: the op interface's reference."""
    return TorchOps().rms_norm(x, weight, eps, residual)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[..., H] -> [rows, H] with a unit stride along H (copies only when it must)."""
    t2d = t.reshape(-1, t.shape[-1])
    return t2d if t2d.stride(-1) == 1 else t2d.contiguous()


# Warps of the norm's one program a row (0: by the row's size, `_num_warps`); a knob for A/B runs.
NUM_WARPS = 0


def _num_warps(block: int) -> int:
    # ~16 values per thread: 4096 columns (H=2880) -> 8 warps.
    return max(1, min(16, block // 512))
