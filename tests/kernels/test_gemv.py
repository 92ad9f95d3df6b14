"""Small-M linear (gossamer/kernels/gemv.py) against torch.nn.functional.linear.

CPU tests run the kernels in the Triton interpreter on tiny fp32/fp16 problems, with shapes picked so
that both kernels (M == 1 and the tl.dot path), the split-K reduction and ragged row/column edges
are all exercised. GPU tests (`-m gpu`) run the decode projections of gpt-oss-120b in bf16.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gossamer.kernels.gemv import plan_gemv
from tests.kernels.interpreted import DEVICE, kernel_fixture

gemv = kernel_fixture("gemv")


def _problem(m: int, n: int, k: int, dtype: torch.dtype, seed: int, device: str = DEVICE):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype).to(device)
    weight = (torch.randn(n, k, generator=g) / k**0.5).to(dtype).to(device)
    bias = torch.randn(n, generator=g).to(dtype).to(device)
    return x, weight, bias


def _exact(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """float64 truth of the same (already rounded) inputs."""
    return F.linear(x.double(), weight.double(), None if bias is None else bias.double())


@pytest.mark.parametrize("m", [1, 2, 5, 16])
@pytest.mark.parametrize("n,k", [(70, 200), (24, 1000), (128, 384)])
def test_float32_matches_exact(gemv, m, n, k):
    x, weight, bias = _problem(m, n, k, torch.float32, seed=m * n + k)
    out = gemv.gemv(x, weight, bias)
    assert out.shape == (m, n) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), _exact(x, weight, bias), atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("m", [1, 3])
def test_float16_rounds_once_from_a_float32_sum(gemv, m):
    x, weight, bias = _problem(m, 40, 1000, torch.float16, seed=11)
    out = gemv.gemv(x, weight, bias)
    assert out.dtype == torch.float16
    expected = _exact(x, weight, bias).to(torch.float16)
    torch.testing.assert_close(out, expected, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("m", [1, 4])
def test_without_bias(gemv, m):
    x, weight, _ = _problem(m, 33, 300, torch.float32, seed=5)
    out = gemv.gemv(x, weight, None)
    torch.testing.assert_close(out.double(), _exact(x, weight, None), atol=2e-5, rtol=2e-5)


def test_split_k_is_exercised_and_covers_every_column():
    # the interpreter plans for 4 SMs: 24 rows -> 2 row blocks, so K=1000 is split
    plan = plan_gemv(1, 24, 1000, 4)
    assert plan.split_k > 1
    for m, n, k, sms in [(1, 24, 1000, 4), (1, 5120, 2880, 132), (1, 128, 2880, 132),
                         (8, 2880, 4096, 132), (1, 201088, 2880, 132), (16, 32, 2880, 132)]:  # fmt: skip
        plan = plan_gemv(m, n, k, sms)
        assert plan.k_per_split % plan.block_k == 0
        assert (plan.split_k - 1) * plan.k_per_split < k <= plan.split_k * plan.k_per_split


def test_strided_input_rows_and_leading_dims(gemv):
    wide = torch.randn(3, 2, 100, device=DEVICE)
    x = wide[:, 0, :]  # row stride 200
    _, weight, bias = _problem(1, 20, 100, torch.float32, seed=2)
    torch.testing.assert_close(
        gemv.gemv(x, weight, bias).double(), _exact(x, weight, bias), atol=2e-5, rtol=2e-5
    )
    batched = torch.randn(2, 3, 100, device=DEVICE)  # [..., K] keeps its leading dims
    out = gemv.gemv(batched, weight, bias)
    assert out.shape == (2, 3, 20)
    torch.testing.assert_close(out.double(), _exact(batched, weight, bias), atol=2e-5, rtol=2e-5)


def test_linear_hands_large_batches_to_torch(gemv):
    x, weight, bias = _problem(gemv.GEMV_MAX_M + 1, 16, 64, torch.float32, seed=4)
    assert torch.equal(gemv.linear(x, weight, bias), F.linear(x, weight, bias))
    with pytest.raises(ValueError, match="at most"):
        gemv.gemv(torch.randn(17, 64, device=DEVICE), weight, bias)


# (name, out_features, in_features): the dense projections of one gpt-oss-120b decode step
GPT_OSS_SHAPES = [
    ("qkv", 5120, 2880),
    ("o_proj", 2880, 4096),
    ("router_120b", 128, 2880),
    ("router_20b", 32, 2880),
    ("unembedding", 201088, 2880),
]


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 8, 16])
@pytest.mark.parametrize("name,n,k", GPT_OSS_SHAPES)
def test_gpu_gpt_oss_projections_bf16(name, n, k, m):
    from gossamer.kernels import gemv as compiled

    x, weight, bias = _problem(m, n, k, torch.bfloat16, seed=n + m, device="cuda")
    bias = None if name == "unembedding" else bias
    out = compiled.gemv(x, weight, bias)
    exact = F.linear(x.float(), weight.float(), None if bias is None else bias.float())
    # float32 accumulation in either order, then one bf16 rounding: within a bf16 ulp or two
    torch.testing.assert_close(out.float(), exact, atol=2e-2, rtol=1e-2)
    cublas = F.linear(x, weight, bias).float()
    ours_error = (out.float() - exact).abs().mean()
    assert ours_error <= 1.2 * (cublas - exact).abs().mean() + 1e-6
