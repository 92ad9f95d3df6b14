"""The late norm fold (gemv.LATE_NORM_MAX_M): a GEMV fed by rms_norm(x + residual) * w computes
rstd * (W @ ((x + residual) * w)), its sums of squares taken beside its dot products, and the MoE's
routing kernel normalises the row for the experts itself (moe_mxfp4.route_fp16's `norm`).

Against the launches it replaces: norm.rms_norm, then gemv.gemv on the same config (and route_fp16
of the normed rows). The new residual must be the same bits; the GEMV's output differs by the
normed rows' rounding to x's dtype, which the late fold never does. The routing kernel's normed
rows are the norm kernel's arithmetic: the same values (bit for bit in the interpreter).

CPU tests run the kernels interpreted on tiny fp32 / fp16 problems: the dot and FMA kernels, split
and unsplit K with both fix-ups, a ragged K tail, M = 1..8, with and without a residual; TritonOps
taking the fold for decode rows; a whole MXFP4 model's decode steps through it against TorchOps.
GPU tests (`-m gpu`) run gpt-oss-120b's QKV and router shapes in bf16.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import gossamer.ops.triton as triton_ops
from gossamer.kernels.gemv import GemvConfig
from gossamer.ops.torch_ref import TorchOps
from tests.kernels.interpreted import DEVICE, ON_GPU, kernel_fixture
from tests.kernels.test_moe_mxfp4 import ALPHA, FP16_TOLERANCE, LIMIT, _experts
from tests.kernels.test_norm_linear import EPS, TINY, _composed, _problem
from tests.kernels.test_router_moe import interpreted_ops  # noqa: F401 (a fixture)
from tests.kernels.test_triton_ops import interpreted_backend  # noqa: F401 (a fixture)

gemv = kernel_fixture("gemv")
norm = kernel_fixture("norm")
moe = kernel_fixture("moe_mxfp4")

LATE_TINY = TINY | {
    "fma_reduce": GemvConfig(kernel="fma", block_n=8, block_k=32, fixup="reduce", num_warps=1),
}
# per dtype: the output's tolerance against norm-then-GEMV, whose normed rows were rounded
OUT_TOLERANCE = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=6e-3, rtol=6e-3),
    torch.bfloat16: dict(atol=3e-2, rtol=2e-2),
}

CASES = [(config, m) for config in ("dot", "dot_no_split") for m in range(1, 9)]
CASES += [("dot_reduce", 1), ("dot_reduce", 5), ("fma", 1), ("fma_no_split", 1), ("fma_reduce", 1)]


def _late(gemv, inputs, config):
    hidden, residual, norm_weight, weight, bias = inputs
    return gemv.norm_linear(hidden, residual, norm_weight, EPS, weight, bias, False, config,
                            late=True)  # fmt: skip


@pytest.mark.parametrize("config,m", CASES)
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_late_fold_matches_norm_then_gemv(gemv, norm, config, m, with_residual, dtype):
    k = 200 if m % 2 else 256  # a ragged K tail at odd M, none at even M
    inputs = _problem(m, 70, k, dtype, seed=11 * m + k, residual=with_residual)
    out, normed, new_residual = _late(gemv, inputs, LATE_TINY[config])
    ref_out, _, ref_residual = _composed(norm, gemv, *inputs, LATE_TINY[config])
    assert normed is None and out.dtype == dtype
    assert torch.equal(new_residual, ref_residual)
    torch.testing.assert_close(out, ref_out, **OUT_TOLERANCE[dtype])


def test_late_fold_scales_by_the_rows_own_rms(gemv):
    """Rows of very different sizes in one call: each output row carries its own 1 / rms (a fold
    that mixed the tokens' sums of squares, or dropped them, fails this)."""
    hidden, residual, norm_weight, weight, bias = _problem(4, 40, 256, torch.float32, seed=5)
    hidden[1] *= 100.0
    hidden[3] *= 1e-2
    residual[3] *= 1e-2
    out, _, _ = _late(gemv, (hidden, residual, norm_weight, weight, bias), LATE_TINY["dot"])
    ref_out, _, _ = TorchOps().norm_linear(hidden, residual, norm_weight, EPS, weight, bias, False)
    torch.testing.assert_close(out, ref_out, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("kernel", ["dot", "fma"])
def test_late_fixups_agree_and_counters_reset(gemv, kernel):
    inputs = _problem(1, 70, 500, torch.float32, seed=9)
    last = _late(gemv, inputs, LATE_TINY[kernel])
    reduced = _late(gemv, inputs, LATE_TINY[f"{kernel}_reduce"])
    assert torch.equal(last[0], reduced[0]) and torch.equal(last[2], reduced[2])
    assert not gemv._counters(inputs[0].device).any()


def test_late_fold_refuses_normed_rows_and_keeps_inputs(gemv):
    hidden, residual, norm_weight, weight, bias = inputs = _problem(1, 24, 200, torch.float32, 4)
    with pytest.raises(ValueError, match="late"):
        gemv.norm_linear(hidden, residual, norm_weight, EPS, weight, bias, True, late=True)
    before = hidden.clone(), residual.clone()
    _, _, new_residual = _late(gemv, inputs, LATE_TINY["fma_no_split"])
    assert torch.equal(hidden, before[0]) and torch.equal(residual, before[1])
    assert new_residual.data_ptr() not in (hidden.data_ptr(), residual.data_ptr())
    first = _late(gemv, (hidden, None, norm_weight, weight, bias), LATE_TINY["fma_no_split"])
    assert first[2] is hidden  # no residual: the stream is the input itself


@pytest.mark.parametrize("tokens", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_route_normalises_as_the_norm_kernel_does(moe, norm, tokens, dtype):
    g = torch.Generator().manual_seed(tokens)
    x = (3 * torch.randn(tokens, 96, generator=g)).to(dtype).to(DEVICE)
    norm_weight = (1 + 0.3 * torch.randn(96, generator=g)).to(DEVICE)
    logits = torch.randn(tokens, 6, generator=g).to(DEVICE)
    normed, _ = norm.rms_norm(x, norm_weight, EPS)
    ours = moe.route_fp16(logits, 2, x, (norm_weight, EPS))
    theirs = moe.route_fp16(logits, 2, normed)
    for a, b in zip(ours, theirs, strict=True):
        if ON_GPU:  # the two kernels' sums may add in different orders: an ulp of rstd
            torch.testing.assert_close(a, b, atol=0, rtol=2e-3)
        else:
            assert torch.equal(a, b)


def test_route_refuses_to_normalise_in_two_passes(moe, monkeypatch):
    monkeypatch.setattr(moe, "_route_block", lambda hidden, layout: hidden // 2)
    x = torch.randn(1, 32, device=DEVICE)
    with pytest.raises(moe.MoEShapeError, match="one fp16 pass"):
        moe.route_fp16(torch.randn(1, 4, device=DEVICE), 2, x, (torch.ones(32, device=DEVICE), EPS))


@pytest.fixture
def late_ops(interpreted_ops, monkeypatch: pytest.MonkeyPatch):  # noqa: F811 (the fixture)
    """TritonOps on this machine's kernels with the late fold on (off by default)."""
    monkeypatch.setattr(triton_ops.gemv, "LATE_NORM_MAX_M", triton_ops.gemv.GEMV_MAX_M)
    monkeypatch.setattr(triton_ops.gemv, "FUSED_NORM_MAX_M", 0)
    return interpreted_ops


def _spy(monkeypatch, module, name: str) -> list:
    calls = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(k) or real(*a, **k))
    return calls


def test_triton_ops_takes_the_late_fold_for_decode_rows(late_ops, monkeypatch):
    kernels = triton_ops.gemv
    folds = _spy(monkeypatch, kernels, "norm_linear")
    for m in (1, kernels.GEMV_MAX_M, kernels.GEMV_MAX_M + 1):
        hidden, residual, norm_weight, weight, bias = _problem(m, 24, 64, torch.float32, seed=m)
        for want_normed in (False, True):  # normed rows wanted: the norm kernel, then the GEMV
            ours = late_ops.norm_linear(hidden, residual, norm_weight, EPS, weight, bias,
                                               want_normed)  # fmt: skip
            ref = TorchOps().norm_linear(hidden, residual, norm_weight, EPS, weight, bias,
                                         want_normed)  # fmt: skip
            torch.testing.assert_close(ours, ref, atol=2e-5, rtol=2e-5)
    assert [call.get("late") for call in folds] == [True, True]  # M = 1 and 8, not normed
    monkeypatch.setattr(kernels, "LATE_NORM_MAX_M", 0)  # the A/B switch
    hidden, residual, norm_weight, weight, bias = _problem(1, 24, 64, torch.float32, seed=0)
    late_ops.norm_linear(hidden, residual, norm_weight, EPS, weight, bias, False)
    assert len(folds) == 2


@pytest.mark.parametrize("tokens", [1, 4])
def test_triton_ops_norm_moe_normalises_in_the_routing(late_ops, monkeypatch, tokens):
    from tests.kernels.test_router_moe import EXPERTS, HIDDEN, INTER, TOP_K
    from tests.kernels.test_router_moe import _problem as router_problem

    kernels = triton_ops._kernel_module("moe_mxfp4")
    monkeypatch.setattr(kernels, "DECODE_FP16_GATE_UP",
                        {**kernels.DECODE_FP16_GATE_UP, "BLOCK_PAIRS": 32})  # fmt: skip
    routed = _spy(monkeypatch, kernels, "moe_mxfp4_decode_fp16")
    experts = _experts(EXPERTS, HIDDEN, INTER, seed=60 + tokens)
    hidden, residual, norm_weight, router_weight, router_bias = router_problem(tokens, 61 + tokens)
    args = (router_weight, router_bias, experts, TOP_K, LIMIT, ALPHA)
    out, new_residual = late_ops.norm_moe(hidden, residual, norm_weight, EPS, *args)
    fp32 = dataclasses.replace(experts, gate_up_bias=experts.gate_up_bias.float(),
                               down_bias=experts.down_bias.float())  # fmt: skip
    ref_out, ref_residual = TorchOps().norm_moe(hidden, residual, norm_weight, EPS,
                                                *args[:2], fp32, *args[3:])  # fmt: skip
    assert [call.get("norm") is not None for call in routed] == [True]
    assert torch.equal(new_residual, ref_residual)
    assert ((out - ref_out).abs().max() / ref_out.abs().max()).item() < FP16_TOLERANCE


@pytest.mark.usefixtures("interpreted_backend")
def test_mxfp4_model_with_the_late_fold_matches_torch_ops(tmp_path, monkeypatch):
    """A whole MXFP4 model's decode steps with both norms of every layer folded late (the QKV
    GEMV's and the router GEMV + routing's) against the same checkpoint on TorchOps."""
    from gossamer.engine.reference import ContiguousCache, forward_tokens
    from gossamer.model.loader import load_model
    from gossamer.model.weights import save_checkpoint
    from tests.hf_models import write_hf_model

    monkeypatch.setattr(triton_ops.gemv, "LATE_NORM_MAX_M", triton_ops.gemv.GEMV_MAX_M)
    monkeypatch.setattr(triton_ops.gemv, "FUSED_NORM_MAX_M", 0)
    folds = _spy(monkeypatch, triton_ops.gemv, "norm_linear")
    dense = load_model(str(write_hf_model(tmp_path / "hf", seed=8, num_hidden_layers=2)),
                       dtype="float32").model  # fmt: skip
    packed_dir = save_checkpoint(dense, tmp_path / "mx")
    ours = load_model(str(packed_dir), dtype="float32", device=DEVICE, ops="triton").model
    reference = load_model(str(packed_dir), dtype="float32", device=DEVICE, ops="torch").model
    tokens = [5, 17, 3, 88, 40, 2, 61, 9, 33, 70, 12, 44]
    prompt = triton_ops.gemv.GEMV_MAX_M + 1  # a prefill past the GEMV's rows: cuBLAS, no fold

    def run(model) -> torch.Tensor:
        cache = ContiguousCache(model, len(tokens))
        logits = [forward_tokens(model, cache, tokens[:prompt], 0)]
        for position in range(prompt, len(tokens)):  # decode rows: the late fold
            logits.append(forward_tokens(model, cache, [tokens[position]], position))
        return torch.cat(logits)

    ours_logits, reference_logits = run(ours), run(reference)
    steps = len(tokens) - prompt
    assert sum(call.get("late", False) for call in folds) == steps * 2 * 2  # x layers x norms
    error = float((ours_logits - reference_logits).norm() / reference_logits.norm())
    assert error < 1e-2  # the fp16 expert GEMVs


# ---- GPU: gpt-oss-120b shapes in bf16 -------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize("m", [1, 4, 8])
@pytest.mark.parametrize("n,k", [(5120, 2880), (128, 2880)])  # QKV, router
def test_gpu_gpt_oss_late_fold_bf16(n, k, m, with_residual):
    from gossamer.kernels import gemv as compiled
    from gossamer.kernels import norm as compiled_norm

    inputs = _problem(m, n, k, torch.bfloat16, seed=m + n, residual=with_residual, device="cuda")
    out, _, new_residual = _late(compiled, inputs, None)
    ref_out, _, ref_residual = _composed(compiled_norm, compiled, *inputs)
    assert torch.equal(new_residual, ref_residual)
    torch.testing.assert_close(out, ref_out, **OUT_TOLERANCE[torch.bfloat16])
    assert (out.float() - ref_out.float()).abs().mean() < 2e-3
