"""Fused residual add + RMSNorm (gossamer/kernels/norm.py) against TorchOps.rms_norm.

Tiny fp32/fp16 tests run in the Triton interpreter (on a machine with a GPU: compiled, on the GPU);
GPU tests (`-m gpu`) run gpt-oss shapes in bf16 against the reference on the same GPU.
"""

from __future__ import annotations

import pytest
import torch

from gossamer.ops.torch_ref import TorchOps
from tests.kernels.interpreted import DEVICE, kernel_fixture

norm = kernel_fixture("norm")
EPS = 1e-5


def _inputs(rows: int, hidden: int, dtype: torch.dtype, seed: int, device: str = DEVICE):
    g = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(rows, hidden, generator=g)).to(dtype).to(device)
    residual = torch.randn(rows, hidden, generator=g).to(dtype).to(device)
    weight = (1 + 0.3 * torch.randn(hidden, generator=g)).to(device)  # float32, as in the model
    return x, residual, weight


def _assert_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    # float32 reductions in a different order; after the final rounding, at most one ulp apart
    tol = dict(atol=1e-5, rtol=1e-5) if ref.dtype == torch.float32 else dict(atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(ours, ref, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rows,hidden", [(1, 64), (5, 40), (3, 100)])
def test_residual_add_then_norm_matches_reference(norm, dtype, rows, hidden):
    x, residual, weight = _inputs(rows, hidden, dtype, seed=rows * hidden)
    normed, new_residual = norm.rms_norm(x, weight, EPS, residual)
    ref_normed, ref_residual = TorchOps().rms_norm(x, weight, EPS, residual)
    # the new residual is x + residual rounded once to the activation dtype, bit for bit
    assert torch.equal(new_residual, ref_residual)
    _assert_close(normed, ref_normed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_without_residual_returns_the_input_as_residual(norm, dtype):
    x, _, weight = _inputs(4, 48, dtype, seed=3)
    normed, residual = norm.rms_norm(x, weight, EPS)
    assert residual is x
    _assert_close(normed, TorchOps().rms_norm(x, weight, EPS)[0])


def test_strided_rows_and_leading_dims(norm):
    wide = torch.randn(6, 80, device=DEVICE)
    x = wide[:, :40]  # row stride 80: read in place
    residual = torch.randn(2, 3, 40, device=DEVICE).view(6, 40)
    weight = torch.rand(40, device=DEVICE) + 0.5
    normed, new_residual = norm.rms_norm(x, weight, EPS, residual)
    ref = TorchOps().rms_norm(x, weight, EPS, residual)
    assert torch.equal(new_residual, ref[1])
    _assert_close(normed, ref[0])
    three_d = torch.randn(2, 3, 40, device=DEVICE)
    _assert_close(
        norm.rms_norm(three_d, weight, EPS)[0], TorchOps().rms_norm(three_d, weight, EPS)[0]
    )


def test_inputs_are_not_modified(norm):
    x, residual, weight = _inputs(3, 32, torch.float32, seed=9)
    x_before, residual_before = x.clone(), residual.clone()
    norm.rms_norm(x, weight, EPS, residual)
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)


def test_zero_rows(norm):
    x = torch.empty(0, 32, device=DEVICE)
    weight = torch.ones(32, device=DEVICE)
    normed, residual = norm.rms_norm(x, weight, EPS, torch.empty(0, 32, device=DEVICE))
    assert normed.shape == (0, 32) and residual.shape == (0, 32)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 7, 64, 4096])
@pytest.mark.parametrize("with_residual", [True, False])
def test_gpu_gpt_oss_shapes_bf16(rows, with_residual):
    from gossamer.kernels import norm as compiled

    x, residual, weight = _inputs(rows, 2880, torch.bfloat16, seed=rows, device="cuda")
    residual = residual if with_residual else None
    normed, new_residual = compiled.rms_norm(x, weight, EPS, residual)
    ref_normed, ref_residual = TorchOps().rms_norm(x, weight, EPS, residual)
    assert torch.equal(new_residual, ref_residual)
    # one bf16 ulp (2^-8 relative) for the rare value whose float32 result sits on a rounding edge
    torch.testing.assert_close(normed, ref_normed, atol=1e-2, rtol=8e-3)
