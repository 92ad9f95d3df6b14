"""The residual add + RMSNorm folded into the GEMV's prologue (gemv.norm_linear, NORM constexpr)
against the two launches it replaces: norm.rms_norm, then gemv.gemv on the same config.

CPU tests run both kernels (tensor-core "dot" and M == 1 "fma") in the Triton interpreter on tiny
fp32/fp16 problems, with and without a split K, a ragged K tail and ragged row blocks, M = 1..8, with
and without a residual. The new residual must be the composed path's bit for bit (one rounded add);
the normed rows and the output may differ by the float32 sum of squares' order (the prologue sums
its row in chunks, the norm kernel in one go): an ulp of the normed values, and what that does to
the dot product. GPU tests (`-m gpu`) run gpt-oss-120b's QKV and router shapes in bf16.
"""

from __future__ import annotations

import pytest
import torch

import gossamer.ops.triton as triton_ops
from gossamer.kernels.gemv import WHOLE_K, GemvConfig
from gossamer.ops.torch_ref import TorchOps
from tests.kernels.interpreted import DEVICE, ON_GPU, kernel_fixture, load_interpreted

gemv = kernel_fixture("gemv")
norm = kernel_fixture("norm")
EPS = 1e-5

# tiles for tiny problems (tests/kernels/test_gemv.py): K = 200 leaves a ragged tail
TINY = {
    "dot": GemvConfig(kernel="dot", block_n=16, block_k=32, num_warps=1),
    "dot_reduce": GemvConfig(kernel="dot", block_n=16, block_k=32, fixup="reduce", num_warps=1),
    "dot_no_split": GemvConfig(kernel="dot", block_n=16, block_k=16, split_k=1, num_warps=1),
    "dot_early": GemvConfig(kernel="dot", block_n=16, block_k=32, num_warps=1, early=True),
    "fma": GemvConfig(kernel="fma", block_n=8, block_k=32, num_warps=1),
    "fma_no_split": GemvConfig(kernel="fma", block_n=8, block_k=16, split_k=1, num_warps=1),
    "fma_whole": GemvConfig(kernel="fma", block_n=1, block_k=WHOLE_K, num_warps=1),  # the router's
}
# per dtype: (normed, out) tolerances, an ulp or two after the final rounding
TOLERANCE = {
    torch.float32: (dict(atol=1e-5, rtol=1e-5), dict(atol=2e-5, rtol=2e-5)),
    torch.float16: (dict(atol=1e-3, rtol=1e-3), dict(atol=4e-3, rtol=4e-3)),
    torch.bfloat16: (dict(atol=1e-2, rtol=8e-3), dict(atol=2e-2, rtol=1e-2)),
}


def _problem(m, n, k, dtype, seed, residual=True, device=DEVICE):
    """(hidden, residual or None, norm weight [float32, as in the model], weight, bias)."""
    g = torch.Generator(device).manual_seed(seed)
    hidden = (3 * torch.randn(m, k, generator=g, device=device)).to(dtype)
    res = torch.randn(m, k, generator=g, device=device).to(dtype) if residual else None
    norm_weight = 1 + 0.3 * torch.randn(k, generator=g, device=device)
    weight = (torch.randn(n, k, generator=g, device=device) / k**0.5).to(dtype)
    bias = torch.randn(n, generator=g, device=device).to(dtype)
    return hidden, res, norm_weight, weight, bias


def _composed(norm, gemv, hidden, residual, norm_weight, weight, bias, config=None):
    """What the model launched before: the norm kernel, then the GEMV of its output."""
    normed, new_residual = norm.rms_norm(hidden, norm_weight, EPS, residual)
    if config is None:
        return gemv.linear(normed, weight, bias), normed, new_residual
    return gemv.gemv(normed, weight, bias, config), normed, new_residual


def _assert_matches(fused, composed, dtype):
    (out, normed, new_residual), (ref_out, ref_normed, ref_residual) = fused, composed
    assert out.dtype == normed.dtype == new_residual.dtype == dtype
    assert torch.equal(new_residual, ref_residual)
    normed_tol, out_tol = TOLERANCE[dtype]
    torch.testing.assert_close(normed, ref_normed, **normed_tol)
    torch.testing.assert_close(out, ref_out, **out_tol)


# every M of the dot kernel with and without a split; the FMA kernel serves M == 1 only
CASES = [(config, m) for config in ("dot", "dot_no_split") for m in range(1, 9)]
CASES += [("dot_reduce", 1), ("dot_reduce", 5), ("fma", 1), ("fma_no_split", 1), ("fma_whole", 1)]


@pytest.mark.parametrize("config,m", CASES)
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fused_matches_norm_then_gemv(gemv, norm, config, m, with_residual, dtype):
    k = 200 if m % 2 else 256  # a ragged K tail at odd M, none at even M
    inputs = _problem(m, 70, k, dtype, seed=7 * m + k, residual=with_residual)
    fused = gemv.norm_linear(*inputs[:3], EPS, *inputs[3:], True, TINY[config])
    _assert_matches(fused, _composed(norm, gemv, *inputs, TINY[config]), dtype)


def test_whole_row_plans_fuse_the_norm_when_asked(gemv, monkeypatch):
    """FUSED_NORM_WHOLE_ROWS: norm_linear serves the batch-1 router-sized GEMV (whole rows a
    program) but not QKV-sized ones, and nothing when off."""
    hidden, residual, _, _, _ = _problem(1, 8, 200, torch.float32, seed=12)
    router, qkv = torch.zeros(32, 200, device=DEVICE), torch.zeros(5120, 200, device=DEVICE)
    monkeypatch.setattr(gemv, "FUSED_NORM_MAX_M", 0)
    monkeypatch.setattr(gemv, "FUSED_NORM_WHOLE_ROWS", True)
    assert gemv.fuses_norm(hidden, residual, router)
    assert not gemv.fuses_norm(hidden, residual, qkv)
    assert not gemv.fuses_norm(torch.cat([hidden, hidden]), None, router)  # M = 2: split planes
    monkeypatch.setattr(gemv, "FUSED_NORM_WHOLE_ROWS", False)
    assert not gemv.fuses_norm(hidden, residual, router)


@pytest.mark.parametrize("config", ["dot", "fma"])
def test_float32_matches_the_torch_reference(gemv, config):
    inputs = _problem(1, 40, 200, torch.float32, seed=3)
    out, normed, new_residual = gemv.norm_linear(*inputs[:3], EPS, *inputs[3:], True, TINY[config])
    ref_out, ref_normed, ref_residual = TorchOps().norm_linear(*inputs[:3], EPS, *inputs[3:], True)
    assert torch.equal(new_residual, ref_residual)
    torch.testing.assert_close(normed, ref_normed, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, ref_out, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("config", ["dot", "fma_no_split"])
def test_inputs_stay_and_outputs_are_fresh(gemv, config):
    hidden, residual, norm_weight, weight, bias = _problem(1, 24, 200, torch.float32, seed=4)
    before = hidden.clone(), residual.clone()
    out, normed, new_residual = gemv.norm_linear(hidden, residual, norm_weight, EPS, weight, bias,
                                                 False, TINY[config])  # fmt: skip
    assert normed is None
    assert torch.equal(hidden, before[0]) and torch.equal(residual, before[1])
    assert new_residual.data_ptr() not in (hidden.data_ptr(), residual.data_ptr())
    with_normed = gemv.norm_linear(hidden, residual, norm_weight, EPS, weight, bias, True,
                                   TINY[config])  # fmt: skip
    assert torch.equal(with_normed[0], out)  # storing the normed rows changes no bit
    # without a residual the residual stream is the input itself, as norm.rms_norm returns it
    first = gemv.norm_linear(hidden, None, norm_weight, EPS, weight, bias, False, TINY[config])
    assert first[2] is hidden


@pytest.mark.parametrize("kernel", ["dot", "fma"])
def test_fixups_agree_and_counters_reset(gemv, kernel):
    inputs = _problem(1, 70, 500, torch.float32, seed=9)
    last = gemv.norm_linear(*inputs[:3], EPS, *inputs[3:], True, TINY[kernel])
    config = TINY["dot_reduce"] if kernel == "dot" else GemvConfig(
        kernel="fma", block_n=8, block_k=32, fixup="reduce", num_warps=1
    )  # fmt: skip
    reduced = gemv.norm_linear(*inputs[:3], EPS, *inputs[3:], True, config)
    for ours, theirs in zip(last, reduced, strict=True):
        assert torch.equal(ours, theirs)
    assert not gemv._counters(inputs[0].device).any()


def test_leading_dims_strided_rows_and_default_configs(gemv, norm):
    wide = torch.randn(3, 2, 100, device=DEVICE)
    hidden = wide[:, 0, :]  # row stride 200
    _, residual, norm_weight, weight, bias = _problem(3, 20, 100, torch.float32, seed=2)
    fused = gemv.norm_linear(hidden, residual, norm_weight, EPS, weight, bias, True)
    _assert_matches(fused, _composed(norm, gemv, hidden, residual, norm_weight, weight, bias),
                    torch.float32)  # fmt: skip
    batched = torch.randn(2, 3, 100, device=DEVICE)  # [..., K] keeps its leading dims
    out, normed, new_residual = gemv.norm_linear(batched, batched.flip(0), norm_weight, EPS, weight,
                                                 bias, True)  # fmt: skip
    assert out.shape == (2, 3, 20) and normed.shape == new_residual.shape == (2, 3, 100)
    empty = gemv.norm_linear(batched[:0], None, norm_weight, EPS, weight, bias, True)
    assert empty[0].shape == (0, 3, 20) and empty[1].shape == (0, 3, 100)
    with pytest.raises(ValueError, match="norm weight"):
        gemv.norm_linear(hidden, None, norm_weight[:50], EPS, weight, bias, True)


@pytest.fixture
def interpreted_ops(monkeypatch: pytest.MonkeyPatch):
    """TritonOps on the kernels this machine runs (interpreted copies without a GPU)."""
    if not ON_GPU:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        for name in ("gemv", "norm"):
            monkeypatch.setattr(triton_ops, name, load_interpreted(name))
    return triton_ops.TritonOps()


def test_triton_ops_fuses_what_the_gemv_serves(interpreted_ops, monkeypatch):
    kernels = triton_ops.gemv
    fused = []
    real = kernels.norm_linear
    monkeypatch.setattr(kernels, "norm_linear", lambda *args: fused.append(args) or real(*args))
    monkeypatch.setattr(kernels, "FUSED_NORM_MAX_M", kernels.GEMV_MAX_M)  # on (default: off)

    def check(m):
        hidden, residual, norm_weight, weight, bias = _problem(m, 24, 64, torch.float32, seed=m)
        ours = interpreted_ops.norm_linear(hidden, residual, norm_weight, EPS, weight, bias, True)
        ref = TorchOps().norm_linear(hidden, residual, norm_weight, EPS, weight, bias, True)
        torch.testing.assert_close(ours, ref, atol=2e-5, rtol=2e-5)

    for m in range(1, kernels.GEMV_MAX_M + 1):  # decode and verification batches
        check(m)
    assert len(fused) == kernels.GEMV_MAX_M
    check(kernels.GEMV_MAX_M + 1)  # cuBLAS rows: the norm kernel, then F.linear
    monkeypatch.setattr(kernels, "FUSED_NORM_MAX_M", 0)  # the A/B switch
    check(1)
    assert len(fused) == kernels.GEMV_MAX_M
    hidden, residual, _, weight, _ = _problem(1, 24, 64, torch.float32, seed=0)
    assert not kernels.fuses_norm(hidden, residual.double(), weight)  # an add that would promote


# ---- GPU: gpt-oss-120b shapes in bf16 -------------------------------------------------------------

# (name, out_features, in_features, want_normed): the norms' consumers in one decoder layer
NORM_CONSUMERS = [("qkv", 5120, 2880, False), ("router", 128, 2880, True)]


def _check_gpu_bf16(fused, composed, want_normed):
    (out, normed, new_residual), (ref_out, ref_normed, ref_residual) = fused, composed
    assert torch.equal(new_residual, ref_residual)
    if want_normed:
        torch.testing.assert_close(normed, ref_normed, **TOLERANCE[torch.bfloat16][0])
        # a different sum order moves rstd by an ulp or so: few bf16 roundings can flip
        assert (normed != ref_normed).float().mean() < 0.01
    else:
        assert normed is None
    torch.testing.assert_close(out, ref_out, **TOLERANCE[torch.bfloat16][1])
    assert (out.float() - ref_out.float()).abs().mean() < 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize("m", [1, 4, 8])
@pytest.mark.parametrize("name,n,k,want_normed", NORM_CONSUMERS)
def test_gpu_gpt_oss_norm_linear_bf16(name, n, k, want_normed, m, with_residual):
    from gossamer.kernels import gemv as compiled
    from gossamer.kernels import norm as compiled_norm

    hidden, residual, norm_weight, weight, bias = _problem(
        m, n, k, torch.bfloat16, seed=n + m, residual=with_residual, device="cuda"
    )
    fused = compiled.norm_linear(hidden, residual, norm_weight, EPS, weight, bias, want_normed)
    composed = _composed(compiled_norm, compiled, hidden, residual, norm_weight, weight, bias)
    _check_gpu_bf16(fused, composed, want_normed)


GPU_CONFIGS = {
    "dot_reduce": GemvConfig(fixup="reduce"),
    "fma": GemvConfig(kernel="fma", block_n=16, block_k=256, num_warps=4),
    "dot_ragged_k": GemvConfig(block_n=32, block_k=128, num_stages=3),  # 2880 % 128 != 0
}


@pytest.mark.gpu
@pytest.mark.parametrize("config", GPU_CONFIGS.keys())
@pytest.mark.parametrize("m", [1, 8])
@pytest.mark.parametrize("name,n,k,want_normed", NORM_CONSUMERS)
def test_gpu_other_configs_bf16(name, n, k, want_normed, m, config):
    from gossamer.kernels import gemv as compiled
    from gossamer.kernels import norm as compiled_norm

    inputs = _problem(m, n, k, torch.bfloat16, seed=n + m, device="cuda")
    fused = compiled.norm_linear(*inputs[:3], EPS, *inputs[3:], want_normed, GPU_CONFIGS[config])
    composed = _composed(compiled_norm, compiled, *inputs, GPU_CONFIGS[config])
    _check_gpu_bf16(fused, composed, want_normed)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 4])
def test_gpu_norm_linear_replays_in_a_cuda_graph(m):
    """A layer's two fused launches (QKV, router): graph replays give the eager bits, and the
    split counters are back at zero."""
    from gossamer.kernels import gemv as compiled

    problems = [_problem(m, n, k, torch.bfloat16, seed=n, device="cuda")
                for _, n, k, _ in NORM_CONSUMERS]  # fmt: skip

    def layer():
        return [compiled.norm_linear(h, r, nw, EPS, w, b, True) for h, r, nw, w, b in problems]

    eager = layer()  # also compiles the kernels
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = layer()
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        for got, expected in zip(outs, eager, strict=True):
            for a, b in zip(got, expected, strict=True):
                assert torch.equal(a, b)
    assert not compiled._counters(torch.device("cuda", torch.cuda.current_device())).any()
