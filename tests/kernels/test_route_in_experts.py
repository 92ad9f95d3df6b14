"""Decode MoE without a routing kernel (moe_mxfp4.ROUTE_IN_EXPERTS): the post-attention norm also
writes the experts' fp16 input (norm.rms_norm_planes) and the two expert GEMVs route from the router
logits themselves (moe_mxfp4.moe_from_logits).

The oracles: the path with the routing kernel (norm.rms_norm, then moe_mxfp4.route_fp16 and
moe_mxfp4_decode_fp16), which must give the same bits, and TorchOps().norm_moe for the whole layer
half. CPU tests run the kernels interpreted in float32 on tiny shapes (6 experts: not a power of
two, top-2); GPU tests run gpt-oss-20b and 120b expert shapes in bf16.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import gossamer.ops.triton as triton_ops
from gossamer.model import mxfp4
from gossamer.ops.base import ExpertWeights
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
norm = kernel_fixture("norm")

EPS = 1e-5
HIDDEN, EXPERTS, INTER, TOP_K = 96, 6, 64, 2


def _problem(tokens: int, seed: int, dtype=torch.float32, hidden=HIDDEN, experts=EXPERTS):
    """(x, residual, norm weight, router weight, router bias) of a layer half."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=g)).to(DEVICE)

    x, residual = rand(tokens, hidden, scale=2.0), rand(tokens, hidden, scale=2.0)
    norm_weight = 1.0 + 0.1 * rand(hidden)
    router_weight, router_bias = rand(experts, hidden, scale=0.3), rand(experts, scale=0.1)
    return x.to(dtype), residual.to(dtype), norm_weight, router_weight.to(dtype), router_bias


@pytest.mark.parametrize("tokens", [1, 3])
@pytest.mark.parametrize("with_residual", [True, False])
def test_norm_planes_are_the_routing_kernels_x(norm, moe, tokens, with_residual):
    x, residual, norm_weight, router_weight, router_bias = _problem(tokens, seed=tokens)
    residual = residual if with_residual else None
    normed, new_residual, x_h, x_unscale = norm.rms_norm_planes(x, norm_weight, EPS, residual)
    ref_normed, ref_residual = norm.rms_norm(x, norm_weight, EPS, residual)
    assert torch.equal(normed, ref_normed) and torch.equal(new_residual, ref_residual)
    logits = F.linear(normed, router_weight, router_bias)
    _, _, ref_x_h, ref_unscale = moe.route_fp16(logits, TOP_K, ref_normed)
    assert torch.equal(x_h, ref_x_h) and torch.equal(x_unscale, ref_unscale)


@pytest.mark.parametrize("keys", [False, True])
@pytest.mark.parametrize("tokens,layout", [(1, "hf"), (3, "fp16_lanes")])
def test_moe_from_logits_gives_the_routed_paths_bits(moe, monkeypatch, tokens, layout, keys):
    """keys: the routing kernel's top-k by packed keys (TOP_K_KEYS), the GEMVs' by two
    reductions; without: both by two reductions. Their bits must not change either way."""
    monkeypatch.setattr(moe, "TOP_K_KEYS", keys)
    experts = _experts(EXPERTS, HIDDEN, INTER, seed=60 + tokens)
    if layout == "fp16_lanes":
        experts = _fp16_lanes(experts)
    monkeypatch.setattr(moe, "DECODE_FP16_GATE_UP", {**moe.DECODE_FP16_GATE_UP, "BLOCK_PAIRS": 32})
    x, residual, norm_weight, router_weight, router_bias = _problem(tokens, seed=70 + tokens)
    normed, _ = TorchOps().rms_norm(x, norm_weight, EPS, residual)
    logits = F.linear(normed, router_weight, router_bias)
    # a near tie between two logits must go the same way in both paths
    logits[0, 1] = logits[0, 4] = logits[0].max()
    _, _, x_h, x_unscale = moe.route_fp16(logits, TOP_K, normed)
    args = (experts, TOP_K, LIMIT, ALPHA)
    ours = moe.moe_from_logits(normed, x_h, x_unscale, logits, *args)
    routed = moe.moe_mxfp4_decode_fp16(normed, logits, *args)
    assert torch.equal(ours, routed)


@pytest.mark.parametrize("tokens", [1, 3])
def test_moe_from_logits_whole_steps_give_the_same_bits(moe, monkeypatch, tokens):
    """The GEMVs that route themselves with WHOLE_STEPS (whole steps of 2 groups unmasked, the
    last of hidden 96's 3 groups and intermediate 64's 2 masked or absent): the routed path's
    bits without it."""
    experts = _fp16_lanes(_experts(EXPERTS, HIDDEN, INTER, seed=80 + tokens))
    gate_up = {"BLOCK_PAIRS": 32, "GROUPS_PER_STEP": 2, "SPLIT_K": 1, "num_warps": 4}
    down = {"BLOCK_ROWS": 32, "GROUPS_PER_STEP": 2, "SPLIT_K": 1, "num_warps": 4, "AHEAD": 2}
    x, residual, norm_weight, router_weight, router_bias = _problem(tokens, seed=90 + tokens)
    normed, _ = TorchOps().rms_norm(x, norm_weight, EPS, residual)
    logits = F.linear(normed, router_weight, router_bias)
    _, _, x_h, x_unscale = moe.route_fp16(logits, TOP_K, normed)
    args = (experts, TOP_K, LIMIT, ALPHA)
    routed = moe.moe_mxfp4_decode_fp16(normed, logits, *args, gate_up, down)
    monkeypatch.setattr(moe, "DECODE_FP16_GATE_UP", gate_up | {"WHOLE_STEPS": 2})
    monkeypatch.setattr(moe, "DECODE_FP16_DOWN", down | {"WHOLE_STEPS": 2})
    monkeypatch.setattr(moe, "ROUTING_GEMV_CHANGES", {})  # by default they keep the masked loop
    assert torch.equal(moe.moe_from_logits(normed, x_h, x_unscale, logits, *args), routed)


def test_routing_gemvs_keep_the_masked_loop(moe, monkeypatch):
    """The GEMVs that route themselves launch with ROUTING_GEMV_CHANGES over the configs (no whole
    steps, no transposed scales: slower there on the H100), the ones after the routing kernel
    with the configs as they are."""
    launched = []

    class Recording:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launched.append((kwargs.get("ROUTE", 0), kwargs["WHOLE_STEPS"],
                                 kwargs.get("SCALES_T", "-")))  # fmt: skip
                return self.kernel[grid](*args, **kwargs)

            return launch

    for name in ("_fp16_gate_up_kernel", "_fp16_down_kernel"):
        monkeypatch.setattr(moe, name, Recording(getattr(moe, name)))
    gate_up = {"BLOCK_PAIRS": 32, "GROUPS_PER_STEP": 2, "SPLIT_K": 1, "num_warps": 4,
               "WHOLE_STEPS": 2, "SCALES_T": 1}  # fmt: skip
    down = {"BLOCK_ROWS": 32, "GROUPS_PER_STEP": 2, "SPLIT_K": 1, "num_warps": 4, "AHEAD": 2,
            "WHOLE_STEPS": 2}  # fmt: skip
    monkeypatch.setattr(moe, "DECODE_FP16_GATE_UP", gate_up)
    monkeypatch.setattr(moe, "DECODE_FP16_DOWN", down)
    experts = _fp16_lanes(_experts(EXPERTS, HIDDEN, INTER, seed=85))
    x, residual, norm_weight, router_weight, router_bias = _problem(1, seed=86)
    normed, _ = TorchOps().rms_norm(x, norm_weight, EPS, residual)
    logits = F.linear(normed, router_weight, router_bias)
    _, _, x_h, x_unscale = moe.route_fp16(logits, TOP_K, normed)
    args = (experts, TOP_K, LIMIT, ALPHA)
    moe.moe_from_logits(normed, x_h, x_unscale, logits, *args)
    moe.moe_mxfp4_decode_fp16(normed, logits, *args)
    assert launched == [(1, 0, 0), (1, 0, "-"), (0, 2, 1), (0, 2, "-")]


@pytest.fixture
def interpreted_ops(monkeypatch: pytest.MonkeyPatch):
    return interpreted_triton_ops(monkeypatch)


def test_triton_ops_norm_moe_routes_in_the_experts_for_decode(interpreted_ops, monkeypatch):
    kernels = triton_ops._kernel_module("moe_mxfp4")
    assert kernels.ROUTE_IN_EXPERTS  # the default
    calls = {"experts": 0, "routing": 0}
    real_experts, real_route = kernels.moe_from_logits, kernels.route_fp16

    def counted(name, real):
        return lambda *a, **k: calls.__setitem__(name, calls[name] + 1) or real(*a, **k)

    monkeypatch.setattr(kernels, "moe_from_logits", counted("experts", real_experts))
    monkeypatch.setattr(kernels, "route_fp16", counted("routing", real_route))
    experts = _experts(EXPERTS, HIDDEN, INTER, seed=80)
    expected = {1: {"experts": 1, "routing": 0}, 7: {"experts": 1}}
    for tokens in (1, 7):  # 2 pairs: routed in the experts; 14 pairs: the grouped path
        x, residual, norm_weight, router_weight, router_bias = _problem(tokens, seed=81)
        args = (router_weight, router_bias, experts, TOP_K, LIMIT, ALPHA)
        out, new_residual = interpreted_ops.norm_moe(x, residual, norm_weight, EPS, *args)
        fp32 = dataclasses.replace(experts, gate_up_bias=experts.gate_up_bias.float(),
                                   down_bias=experts.down_bias.float())  # fmt: skip
        ref_out, ref_residual = TorchOps().norm_moe(x, residual, norm_weight, EPS,
                                                    *args[:2], fp32, *args[3:])  # fmt: skip
        assert torch.equal(new_residual, ref_residual)
        assert ((out - ref_out).abs().max() / ref_out.abs().max()).item() < FP16_TOLERANCE
        assert calls.items() >= expected[tokens].items()
    # the routing kernel again: above the expert limit (gpt-oss-120b's 128), or switched off
    x, residual, norm_weight, router_weight, router_bias = _problem(1, seed=82)
    args = (x, residual, norm_weight, EPS, router_weight, router_bias, experts, TOP_K, LIMIT, ALPHA)
    for switch, value in (
        ("ROUTE_IN_EXPERTS_MAX_EXPERTS", EXPERTS - 1),
        ("ROUTE_IN_EXPERTS", False),
    ):
        with monkeypatch.context() as patch:
            patch.setattr(kernels, switch, value)
            calls.update(experts=0, routing=0)
            interpreted_ops.norm_moe(*args)
            assert calls == {"experts": 0, "routing": 1}


def _random_packed_experts(num_experts: int, hidden: int, inter: int, seed: int) -> ExpertWeights:
    """Random bytes as packed experts on the GPU (quantizing 128 real-sized experts on the CPU
    would take minutes; both paths read the same bits), scales 2^-9..2^-5."""
    g = torch.Generator(device="cuda").manual_seed(seed)

    def codes(*shape):
        return torch.randint(0, 256, shape, generator=g, device="cuda", dtype=torch.uint8)

    def scales(*shape):
        return torch.randint(118, 123, shape, generator=g, device="cuda", dtype=torch.uint8)

    def bias(*shape):
        return 0.1 * torch.randn(*shape, generator=g, device="cuda")

    return ExpertWeights(
        gate_up_bias=bias(num_experts, 2 * inter),
        down_bias=bias(num_experts, hidden),
        gate_up_blocks=codes(num_experts, 2 * inter, hidden // 32, 16),
        gate_up_scales=scales(num_experts, 2 * inter, hidden // 32),
        down_blocks=codes(num_experts, hidden, inter // 32, 16),
        down_scales=scales(num_experts, hidden, inter // 32),
        layout=mxfp4.LAYOUT_FP16_LANES,
    )


@pytest.mark.gpu
@pytest.mark.parametrize("keys", [False, True])
@pytest.mark.parametrize("model", ["gpt-oss-20b", "gpt-oss-120b"])
@pytest.mark.parametrize("tokens", [1, 8])
def test_gpu_moe_from_logits_gives_the_routed_paths_bits(model, tokens, keys, monkeypatch):
    """Real expert shapes in bf16: the norm's planes and both GEMVs' own routing (two reductions a
    slot) give the routing kernel's path bit for bit (keys: the routing kernel's top-k by packed
    keys, whose ids and weights are the two-reduction top-k's too)."""
    from gossamer.kernels import moe_mxfp4 as gpu_moe
    from gossamer.kernels import norm as gpu_norm

    num_experts = 32 if model == "gpt-oss-20b" else 128
    hidden = inter = 2880
    experts = _random_packed_experts(num_experts, hidden, inter, seed=90)
    x, residual, norm_weight, router_weight, router_bias = _problem(
        tokens, seed=91, hidden=hidden, experts=num_experts, dtype=torch.bfloat16
    )
    normed, new_residual, x_h, x_unscale = gpu_norm.rms_norm_planes(x, norm_weight, EPS, residual)
    assert torch.equal(normed, gpu_norm.rms_norm(x, norm_weight, EPS, residual)[0])
    logits = F.linear(normed, router_weight, router_bias.bfloat16())
    monkeypatch.setattr(gpu_moe, "TOP_K_KEYS", False)
    ref_ids, ref_weights, ref_x_h, ref_unscale = gpu_moe.route_fp16(logits, 4, normed)
    assert torch.equal(x_h, ref_x_h) and torch.equal(x_unscale, ref_unscale)
    if keys:
        monkeypatch.setattr(gpu_moe, "TOP_K_KEYS", True)
        key_ids, key_weights, _, _ = gpu_moe.route_fp16(logits, 4, normed)
        assert torch.equal(key_ids, ref_ids) and torch.equal(key_weights, ref_weights)
    args = (experts, 4, LIMIT, ALPHA)
    ours = gpu_moe.moe_from_logits(normed, x_h, x_unscale, logits, *args)
    assert torch.equal(ours, gpu_moe.moe_mxfp4_decode_fp16(normed, logits, *args))


def test_mxfp4_model_on_triton_ops_matches_torch_ops(tmp_path, monkeypatch):
    """A whole MXFP4 model's decode steps through the self-routing expert GEMVs (the model's
    `norm_moe` call) against the same checkpoint on TorchOps."""
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
    routed_in_experts = []
    real = kernels.moe_from_logits
    monkeypatch.setattr(kernels, "moe_from_logits",
                        lambda *a: routed_in_experts.append(a) or real(*a))  # fmt: skip
    dense = load_model(str(write_hf_model(tmp_path / "hf", seed=8, num_hidden_layers=2)),
                       dtype="float32").model  # fmt: skip
    packed_dir = save_checkpoint(dense, tmp_path / "mx")
    ours = load_model(str(packed_dir), dtype="float32", device=DEVICE, ops="triton").model
    reference = load_model(str(packed_dir), dtype="float32", device=DEVICE, ops="torch").model
    tokens = [5, 17, 3, 88, 40, 2, 61, 9, 33, 70]

    def run(model) -> torch.Tensor:
        cache = ContiguousCache(model, len(tokens))
        logits = [forward_tokens(model, cache, tokens[:8], 0)]
        for position in range(8, len(tokens)):  # decode: the experts route themselves
            logits.append(forward_tokens(model, cache, [tokens[position]], position))
        return torch.cat(logits)

    ours_logits, reference_logits = run(ours), run(reference)
    assert len(routed_in_experts) == 2 * 2  # two decode steps, two layers
    error = float((ours_logits - reference_logits).norm() / reference_logits.norm())
    assert error < 1e-2  # the fp16 expert GEMVs
