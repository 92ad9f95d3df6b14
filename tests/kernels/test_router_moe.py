"""The post-attention norm, router and routing in one launch (moe_mxfp4.router_route / router_moe,
TritonOps.norm_moe) against TorchOps: the norm and F.linear for the logits, torch.topk + softmax
for the routing, TorchOps().norm_moe for the whole layer half.

CPU tests run the kernels interpreted in float32 on tiny shapes: hidden 96 (two router programs,
the second one partial), 6 experts (not a power of two), 1 to 8 tokens.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import gossamer.ops.triton as triton_ops
from gossamer.ops.torch_ref import TorchOps
from tests.kernels.interpreted import (
    DEVICE,
    ON_GPU,
    interpreted_triton_ops,
    kernel_fixture,
    load_interpreted,
)
from tests.kernels.test_moe_mxfp4 import ALPHA, FP16_TOLERANCE, LIMIT, _experts, _fp16_lanes

moe = kernel_fixture("moe_mxfp4")

EPS = 1e-5
HIDDEN, EXPERTS, INTER, TOP_K = 96, 6, 64, 2


def _problem(tokens: int, seed: int, dtype=torch.float32, hidden=HIDDEN, experts=EXPERTS):
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=g)).to(DEVICE)

    x, residual = rand(tokens, hidden, scale=2.0), rand(tokens, hidden, scale=2.0)
    norm_weight = 1.0 + 0.1 * rand(hidden)
    router_weight, router_bias = rand(experts, hidden, scale=0.3), rand(experts, scale=0.1)
    return x.to(dtype), residual.to(dtype), norm_weight, router_weight.to(dtype), router_bias


def _planes(x: torch.Tensor) -> torch.Tensor:
    """x [T, H] in the fp16 GEMV's pair-plane order (see test_fp16_route_scales_x_into_range)."""
    tokens, hidden = x.shape
    return x.view(tokens, hidden // 8, 2, 4).permute(0, 3, 1, 2).reshape(tokens, hidden)


@pytest.mark.parametrize("tokens", [1, 3, 8])
@pytest.mark.parametrize("mode", ["norm", "norm_first_layer", "normed_input"])
def test_router_route_matches_norm_linear_topk(moe, tokens, mode):
    hidden, residual, norm_weight, router_weight, router_bias = _problem(tokens, seed=tokens)
    residual = None if mode == "norm_first_layer" else residual
    normed, new_residual = TorchOps().rms_norm(hidden, norm_weight, EPS, residual)
    logits = F.linear(normed, router_weight, router_bias)
    if mode == "normed_input":  # the norm ran as its own kernel
        routed = moe.router_route(normed, None, None, EPS, router_weight, router_bias, TOP_K)
    else:
        routed = moe.router_route(hidden, residual, norm_weight, EPS, router_weight, router_bias,
                                  TOP_K)  # fmt: skip
    ids, weights, x_h, x_unscale, residual_out = routed
    ref_ids, ref_weights = moe.route_reference(logits, TOP_K)
    assert torch.equal(ids.long(), ref_ids.long())
    torch.testing.assert_close(weights, ref_weights, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x_h.float() * x_unscale[:, None], _planes(normed), rtol=1e-3,
                               atol=1e-6)  # fmt: skip
    peaks = x_h.float().abs().amax(dim=1)
    assert ((peaks >= 2**14) & (peaks < 2**15)).all()
    expected_residual = normed if mode == "normed_input" else new_residual
    assert torch.equal(residual_out, expected_residual)


def test_router_route_resets_its_counter(moe):
    """The last program zeroes the arrival counter: a second launch routes as the first did."""
    hidden, residual, norm_weight, router_weight, router_bias = _problem(2, seed=11)
    first = moe.router_route(hidden, residual, norm_weight, EPS, router_weight, router_bias, TOP_K)
    again = moe.router_route(hidden, residual, norm_weight, EPS, router_weight, router_bias, TOP_K)
    assert moe._router_counter(hidden.device).item() == 0
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("tokens", [1, 4])
@pytest.mark.parametrize("router_norm", [True, False])
@pytest.mark.parametrize("layout", ["hf", "fp16_lanes"])
def test_norm_moe_matches_torch_ops(moe, monkeypatch, tokens, router_norm, layout):
    experts = _experts(EXPERTS, HIDDEN, INTER, seed=20 + tokens)
    if layout == "fp16_lanes":
        experts = _fp16_lanes(experts)
    monkeypatch.setattr(moe, "DECODE_FP16_GATE_UP", {**moe.DECODE_FP16_GATE_UP, "BLOCK_PAIRS": 32})
    hidden, residual, norm_weight, router_weight, router_bias = _problem(tokens, seed=30 + tokens)
    args = (router_weight, router_bias, experts, TOP_K, LIMIT, ALPHA)
    assert moe.fuses_router(hidden, residual, router_weight, experts, TOP_K, LIMIT)
    if router_norm:
        out, new_residual = moe.router_moe(hidden, residual, norm_weight, EPS, *args)
    else:
        normed, new_residual = TorchOps().rms_norm(hidden, norm_weight, EPS, residual)
        out, _ = moe.router_moe(normed, None, None, EPS, *args)
    fp32 = dataclasses.replace(experts, gate_up_bias=experts.gate_up_bias.float(),
                               down_bias=experts.down_bias.float())  # fmt: skip
    ref_out, ref_residual = TorchOps().norm_moe(hidden, residual, norm_weight, EPS,
                                                router_weight, router_bias, fp32, TOP_K, LIMIT,
                                                ALPHA)  # fmt: skip
    assert torch.equal(new_residual, ref_residual)
    error = ((out - ref_out).abs().max() / ref_out.abs().max()).item()
    assert error < FP16_TOLERANCE


@pytest.fixture(autouse=True)
def fused_router_on(monkeypatch):
    """The fused router is off by default (slower on the H200); these tests turn it on."""
    for module in (load_interpreted("moe_mxfp4"),) if not ON_GPU else ():
        monkeypatch.setattr(module, "FUSED_ROUTER", True)
    import gossamer.kernels.moe_mxfp4 as regular

    monkeypatch.setattr(regular, "FUSED_ROUTER", True)


def test_fuses_router_only_decode_sized_mxfp4_fp16_problems(moe, monkeypatch):
    experts = _experts(EXPERTS, HIDDEN, INTER, seed=40)
    hidden, residual, _, router_weight, _ = _problem(moe.ROUTER_MAX_TOKENS + 1, seed=41)

    def fuses(x=hidden[:1], res=residual[:1], w=router_weight, ex=experts, limit=LIMIT):
        return moe.fuses_router(x, res, w, ex, TOP_K, limit)

    assert fuses()
    assert not fuses(x=hidden, res=residual)  # more tokens than a decode step's
    assert not fuses(limit=float("inf"))  # the fp16 GEMV needs a finite SwiGLU limit
    assert not fuses(w=router_weight.half())  # the router's dtype differs from x's
    dense = dataclasses.replace(experts, gate_up_blocks=None, gate_up_dense=torch.zeros(1))
    assert not fuses(ex=dense)
    monkeypatch.setattr(moe, "FUSED_ROUTER", False)  # the switch (off by default: measured slower)
    assert not fuses()


@pytest.fixture
def interpreted_ops(monkeypatch: pytest.MonkeyPatch):
    return interpreted_triton_ops(monkeypatch)


@pytest.mark.parametrize("router_norm", [True, False])
def test_triton_ops_norm_moe_takes_the_fused_path_for_decode(interpreted_ops, monkeypatch,
                                                             router_norm):  # fmt: skip
    kernels = triton_ops._kernel_module("moe_mxfp4")
    monkeypatch.setattr(kernels, "ROUTER_NORM", router_norm)
    fused = []
    real = kernels.router_moe
    monkeypatch.setattr(kernels, "router_moe", lambda *a: fused.append(a) or real(*a))
    experts = _experts(EXPERTS, HIDDEN, INTER, seed=50)
    for tokens in (1, kernels.ROUTER_MAX_TOKENS + 1):  # fused, then composed
        hidden, residual, norm_weight, router_weight, router_bias = _problem(tokens, seed=51)
        args = (router_weight, router_bias, experts, TOP_K, LIMIT, ALPHA)
        out, new_residual = interpreted_ops.norm_moe(hidden, residual, norm_weight, EPS, *args)
        ref_out, ref_residual = TorchOps().norm_moe(hidden, residual, norm_weight, EPS, *args)
        torch.testing.assert_close(new_residual, ref_residual)
        assert ((out - ref_out).abs().max() / ref_out.abs().max()).item() < FP16_TOLERANCE
    assert len(fused) == 1


def test_mxfp4_model_on_triton_ops_matches_torch_ops(tmp_path, monkeypatch):
    """A whole MXFP4 model's decode steps through the fused router (the model's `norm_moe` call)
    against the same checkpoint on TorchOps."""
    from gossamer.engine.reference import ContiguousCache, forward_tokens
    from gossamer.model.loader import load_model
    from gossamer.model.weights import save_checkpoint
    from tests.hf_models import write_hf_model
    from tests.kernels.test_triton_ops import KERNEL_MODULES

    if not ON_GPU:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        modules = {name: load_interpreted(name) for name in KERNEL_MODULES}
        for name in ("gemv", "norm", "rope"):
            monkeypatch.setattr(triton_ops, name, modules[name])
        monkeypatch.setattr(triton_ops, "_kernel_module", modules.get)
    kernels = triton_ops._kernel_module("moe_mxfp4")
    fused = []
    real = kernels.router_moe
    monkeypatch.setattr(kernels, "router_moe", lambda *a: fused.append(a) or real(*a))
    dense = load_model(str(write_hf_model(tmp_path / "hf", seed=8, num_hidden_layers=2)),
                       dtype="float32").model  # fmt: skip
    packed_dir = save_checkpoint(dense, tmp_path / "mx")
    ours = load_model(str(packed_dir), dtype="float32", device=DEVICE, ops="triton").model
    reference = load_model(str(packed_dir), dtype="float32", device=DEVICE, ops="torch").model
    tokens = [5, 17, 3, 88, 40, 2, 61, 9, 33, 70]

    def run(model) -> torch.Tensor:
        cache = ContiguousCache(model, len(tokens))
        logits = [forward_tokens(model, cache, tokens[:8], 0)]
        for position in range(8, len(tokens)):  # decode: the fused router
            logits.append(forward_tokens(model, cache, [tokens[position]], position))
        return torch.cat(logits)

    ours_logits, reference_logits = run(ours), run(reference)
    assert len(fused) == 2 * 2  # two decode steps, two layers
    error = float((ours_logits - reference_logits).norm() / reference_logits.norm())
    assert error < 1e-2  # the fp16 expert GEMVs
