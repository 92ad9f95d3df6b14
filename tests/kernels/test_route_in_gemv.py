"""The MoE routing folded into the packed-fp16 decode GEMVs (moe_mxfp4.ROUTE_IN_GEMV): the norm
kernel's fp16 planes (norm.rms_norm_fp16_planes), gate_up and down picking their experts from the
router logits (ROUTE), and TritonOps.norm_moe with the switch on.

The oracle is the path they replace: route_fp16's x_h / x_unscale, the GEMVs fed route_fp16's ids
and weights, and norm_moe with the switch off. CPU tests run the kernels interpreted on tiny shapes
(hidden 64, intermediate 64, 8 experts, top 4) in fp32 and fp16, with router logits full of ties
(at the top, across the top-k boundary, -0 against +0). GPU tests (`-m gpu`) use gpt-oss-120b
shapes in bf16.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import gossamer.ops.triton as triton_ops
from gossamer.ops.base import ExpertWeights
from tests.kernels.interpreted import DEVICE, ON_GPU, kernel_fixture
from tests.kernels.test_moe_mxfp4 import (  # noqa: F401 (the experts_120b fixture)
    ALPHA,
    E_120B,
    H_120B,
    I_120B,
    LIMIT,
    TOP_K_120B,
    _experts,
    _fp16_lanes,
    experts_120b,
)
from tests.kernels.test_norm import _inputs as _activations
from tests.kernels.test_router_moe import interpreted_ops  # noqa: F401 (a fixture)

moe = kernel_fixture("moe_mxfp4")
norm = kernel_fixture("norm")

EPS = 1e-5
HIDDEN, INTER, EXPERTS, TOP_K = 64, 64, 8, 4
GATE_UP = {"BLOCK_PAIRS": 64, "GROUPS_PER_STEP": 2, "SPLIT_K": 1, "num_warps": 4}
DOWN = {"BLOCK_ROWS": 64, "GROUPS_PER_STEP": 2, "SPLIT_K": 1, "num_warps": 1, "AHEAD": 2}

# Router logits rows (8 experts) and the experts _top_k_softmax picks for them, in slot order.
TIED_ROWS = [
    ([1.0, 3.0, 3.0, 0.0, 3.0, -1.0, 3.0, 2.0], [1, 2, 4, 6]),  # four equal at the top
    ([0.0, -0.0, -1.0, -2.0, -0.0, 0.0, -3.0, -0.5], [0, 1, 4, 5]),  # -0 ties with +0
    ([-1.0, -2.0, -0.5, -2.0, -1.0, -2.0, -3.0, -1.0], [2, 0, 4, 7]),  # negatives
    ([2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0], [0, 1, 2, 3]),  # a tie across the boundary
    ([0.25, -1.5, 0.75, 0.5, -0.25, 1.25, -0.75, 1.0], [5, 7, 2, 3]),  # no ties
]


def _tied_logits(tokens: int, dtype: torch.dtype, num_experts: int = EXPERTS) -> torch.Tensor:
    """[tokens, num_experts] logits from TIED_ROWS, the rows rotated per token so that every token
    count meets different rows (first num_experts columns)."""
    rows = [TIED_ROWS[(t * 3 + tokens) % len(TIED_ROWS)][0][:num_experts] for t in range(tokens)]
    return torch.tensor(rows, dtype=dtype, device=DEVICE)


def _expected_ids(logits: torch.Tensor) -> list[int]:
    """The picks of TIED_ROWS for these rows (the rows are found by value)."""
    ids = []
    for row in logits.float().tolist():
        match = [picks for values, picks in TIED_ROWS if values[: len(row)] == row]
        ids += match[0]
    return ids


def _assert_same_sums(ours: torch.Tensor, ref: torch.Tensor) -> None:
    """Bit-equal in the interpreter; on the GPU the softmax's sum over the k chosen logits may add
    in another order than the routing kernel's (another thread layout): one rounding apart."""
    if ON_GPU:
        torch.testing.assert_close(ours, ref, rtol=1e-2, atol=1e-2 * ref.abs().max().item())
    else:
        assert torch.equal(ours, ref)


# ------------------------------------------------------------------------------------------------
# The norm kernel's fp16 planes
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("with_residual", [True, False])
def test_norm_planes_are_route_fp16s(norm, moe, dtype, with_residual):
    """Hidden 96: a row is a partial block of the kernel (128 lanes). Row 2 normalises to zeros."""
    x, residual, weight = _activations(3, 96, dtype, seed=int(with_residual))
    residual = residual if with_residual else None
    x[2] = 0.0 if residual is None else -residual[2]
    normed, new_residual, x_h, x_unscale = norm.rms_norm_fp16_planes(x, weight, EPS, residual)
    ref_normed, ref_residual = norm.rms_norm(x, weight, EPS, residual)
    assert torch.equal(normed, ref_normed) and torch.equal(new_residual, ref_residual)
    logits = torch.zeros(3, 4, dtype=dtype, device=DEVICE)
    _, _, ref_x_h, ref_unscale = moe.route_fp16(logits, 2, normed)
    assert x_h.dtype == torch.float16 and x_unscale.dtype == torch.float32
    assert torch.equal(x_h, ref_x_h) and torch.equal(x_unscale, ref_unscale)


def test_norm_planes_need_rows_of_whole_words(norm):
    x, _, weight = _activations(2, 36, torch.float32, seed=5)
    with pytest.raises(ValueError, match="multiple of 8"):
        norm.rms_norm_fp16_planes(x, weight, EPS)


# ------------------------------------------------------------------------------------------------
# gate_up and down routing themselves
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype,tokens,num_experts",
    [
        (torch.float16, 1, 8),
        (torch.float16, 2, 8),
        (torch.float16, 3, 8),
        (torch.float16, 4, 8),
        (torch.float32, 1, 8),
        (torch.float32, 4, 8),
        (torch.float16, 3, 6),  # not a power of two: the key vector has empty lanes
    ],
)
def test_routed_gemvs_equal_the_ids_kernels(moe, dtype, tokens, num_experts):
    """gate_up (ROUTE) writes the same activations as fed route_fp16's ids, bit for bit (the same
    expert in every slot, ties included); down (ROUTE) the same output as fed its ids and weights."""
    experts = _experts(num_experts, HIDDEN, INTER, seed=tokens)
    x, _, _ = _activations(tokens, HIDDEN, dtype, seed=10 + tokens)
    logits = _tied_logits(tokens, dtype, num_experts)
    ids, route_w, x_h, x_unscale = moe.route_fp16(logits, TOP_K, x)
    if num_experts == EXPERTS:
        assert ids.tolist() == _expected_ids(logits)  # the rule the kernels must follow
    act_exp = moe.act_exponent(LIMIT)
    common = (experts, INTER, TOP_K, LIMIT, ALPHA, act_exp, GATE_UP)
    act = moe._fp16_gate_up(x_h, x_unscale, ids, *common)
    routed_act = moe._fp16_gate_up(x_h, x_unscale, None, *common, logits)
    assert torch.equal(routed_act, act)
    out, routed_out = torch.empty_like(x), torch.empty_like(x)
    moe._fp16_down(act, ids, route_w, experts, out, INTER, TOP_K, act_exp, DOWN)
    moe._fp16_down(act, None, None, experts, routed_out, INTER, TOP_K, act_exp, DOWN, logits)
    _assert_same_sums(routed_out, out)


@pytest.mark.parametrize("tokens", [2])
def test_moe_mxfp4_routed_equals_the_decode_path(norm, moe, tokens):
    """The host entry (norm planes in, logits with a row stride) against moe_mxfp4_decode_fp16."""
    experts = _fp16_lanes(_experts(EXPERTS, HIDDEN, INTER, seed=20 + tokens))
    x, residual, weight = _activations(tokens, HIDDEN, torch.float16, seed=30 + tokens)
    normed, _, x_h, x_unscale = norm.rms_norm_fp16_planes(x, weight, EPS, residual)
    wide = torch.zeros(tokens, 2 * EXPERTS, dtype=torch.float16, device=DEVICE)
    wide[:, :EXPERTS] = _tied_logits(tokens, torch.float16)
    logits = wide[:, :EXPERTS]  # row stride 2E: read in place
    configs = {"gate_up_config": GATE_UP, "down_config": DOWN}
    ref = moe.moe_mxfp4_decode_fp16(normed, logits, experts, TOP_K, LIMIT, ALPHA, **configs)
    out = moe.moe_mxfp4_routed(normed, x_h, x_unscale, logits, experts, TOP_K, LIMIT, ALPHA,
                               **configs)  # fmt: skip
    _assert_same_sums(out, ref)


def test_routed_gemvs_refuse_split_k(moe):
    experts = _experts(EXPERTS, HIDDEN, INTER, seed=3)
    x, _, _ = _activations(1, HIDDEN, torch.float32, seed=3)
    logits = _tied_logits(1, torch.float32)
    _, _, x_h, x_unscale = moe.route_fp16(logits, TOP_K, x)
    with pytest.raises(moe.MoEShapeError, match="split K"):
        moe.moe_mxfp4_routed(x, x_h, x_unscale, logits, experts, TOP_K, LIMIT, ALPHA,
                             gate_up_config=GATE_UP | {"SPLIT_K": 2})  # fmt: skip


# ------------------------------------------------------------------------------------------------
# The switch: which problems take the path, and TritonOps.norm_moe with it on and off
# ------------------------------------------------------------------------------------------------


def _router_problem(tokens: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    hidden = (2 * torch.randn(tokens, HIDDEN, generator=g)).to(dtype).to(DEVICE)
    residual = (2 * torch.randn(tokens, HIDDEN, generator=g)).to(dtype).to(DEVICE)
    norm_weight = (1 + 0.1 * torch.randn(HIDDEN, generator=g)).to(DEVICE)
    router_weight = (0.3 * torch.randn(EXPERTS, HIDDEN, generator=g)).to(dtype).to(DEVICE)
    router_bias = (0.1 * torch.randn(EXPERTS, generator=g)).to(dtype).to(DEVICE)
    return hidden, residual, norm_weight, router_weight, router_bias


def test_routes_in_gemv_only_when_on_and_on_the_fp16_gemv_path(moe, monkeypatch):
    experts = _experts(EXPERTS, HIDDEN, INTER, seed=40)
    hidden, residual, _, router_weight, _ = _router_problem(5, torch.float32, seed=41)

    def routes(x=hidden[:1], res=residual[:1], w=router_weight, ex=experts, limit=LIMIT):
        return moe.routes_in_gemv(x, res, w, ex, TOP_K, limit)

    assert not routes()  # off by default
    monkeypatch.setattr(moe, "ROUTE_IN_GEMV", True)
    assert routes() and routes(x=hidden[:4], res=None)
    assert not routes(x=hidden, res=residual)  # 5 x 4 pairs: past the GEMV path (2 per expert)
    assert not routes(limit=float("inf"))  # the fp16 GEMV needs a finite SwiGLU limit
    assert not routes(w=router_weight.half())  # the router's dtype differs from x's
    dense = dataclasses.replace(experts, gate_up_blocks=None, gate_up_dense=torch.zeros(1))
    assert not routes(ex=dense)
    monkeypatch.setattr(moe, "DECODE_FP16_DOWN", moe.DECODE_FP16_DOWN | {"SPLIT_K": 2})
    assert not routes()


def _norm_moe_on_and_off(ops, monkeypatch, problem, experts, configs=None):
    """TritonOps.norm_moe with ROUTE_IN_GEMV off, then on -> (off, on, routed calls)."""
    kernels = triton_ops._kernel_module("moe_mxfp4")
    for name, config in (configs or {}).items():
        monkeypatch.setattr(kernels, name, config)
    hidden, residual, norm_weight, router_weight, router_bias = problem
    args = (hidden, residual, norm_weight, EPS, router_weight, router_bias, experts, TOP_K, LIMIT,
            ALPHA)  # fmt: skip
    off = ops.norm_moe(*args)
    monkeypatch.setattr(kernels, "ROUTE_IN_GEMV", True)
    calls = []
    real = kernels.moe_mxfp4_routed
    monkeypatch.setattr(kernels, "moe_mxfp4_routed", lambda *a: calls.append(a) or real(*a))
    return off, ops.norm_moe(*args), calls


@pytest.mark.parametrize("tokens,with_residual", [(1, True), (4, False)])
def test_norm_moe_switched_on_equals_switched_off(interpreted_ops, monkeypatch, tokens,  # noqa: F811
                                                  with_residual):  # fmt: skip
    experts = _experts(EXPERTS, HIDDEN, INTER, seed=50 + tokens)
    problem = _router_problem(tokens, torch.float32, seed=51 + tokens)
    if not with_residual:
        problem = (problem[0], None, *problem[2:])
    configs = {"DECODE_FP16_GATE_UP": GATE_UP, "DECODE_FP16_DOWN": DOWN}
    off, on, calls = _norm_moe_on_and_off(interpreted_ops, monkeypatch, problem, experts, configs)
    assert len(calls) == 1
    assert torch.equal(on[1], off[1])  # the new residual
    _assert_same_sums(on[0], off[0])


# ------------------------------------------------------------------------------------------------
# GPU: gpt-oss-120b shapes, bf16
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lanes_120b(experts_120b) -> ExpertWeights:  # noqa: F811
    """test_moe_mxfp4's random gpt-oss-120b experts in the bit layout the GPU loader gives them."""
    return _fp16_lanes(experts_120b)


def _tied_logits_120b(tokens: int, seed: int) -> torch.Tensor:
    """bf16 logits with many ties: 128 experts over 12 values, some of them -0 and +0."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    steps = torch.randint(-6, 6, (tokens, E_120B), generator=g, device="cuda")
    logits = (steps.float() / 4).bfloat16()
    negative_zero = (steps == 0) & (torch.rand(tokens, E_120B, generator=g, device="cuda") < 0.5)
    return torch.where(negative_zero, torch.full_like(logits, -0.0), logits)


def _problem_120b(tokens: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*shape, scale=1.0):
        return scale * torch.randn(*shape, generator=g, device="cuda")

    hidden, residual = rand(tokens, H_120B).bfloat16(), rand(tokens, H_120B).bfloat16()
    norm_weight = 1.0 + 0.1 * rand(H_120B)
    router_weight = rand(E_120B, H_120B, scale=H_120B**-0.5).bfloat16()
    return hidden, residual, norm_weight, router_weight, rand(E_120B, scale=0.1).bfloat16()


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 4])
def test_gpu_norm_planes_are_route_fp16s(tokens):
    from gossamer.kernels import moe_mxfp4
    from gossamer.kernels import norm as compiled

    hidden, residual, norm_weight, _, _ = _problem_120b(tokens, seed=tokens)
    normed, new_residual, x_h, x_unscale = compiled.rms_norm_fp16_planes(hidden, norm_weight, EPS,
                                                                        residual)  # fmt: skip
    ref_normed, ref_residual = compiled.rms_norm(hidden, norm_weight, EPS, residual)
    assert torch.equal(normed, ref_normed) and torch.equal(new_residual, ref_residual)
    logits = _tied_logits_120b(tokens, seed=tokens)
    _, _, ref_x_h, ref_unscale = moe_mxfp4.route_fp16(logits, TOP_K_120B, normed)
    assert torch.equal(x_h, ref_x_h) and torch.equal(x_unscale, ref_unscale)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 2, 3, 4])
def test_gpu_120b_routed_gemvs_equal_the_ids_kernels(lanes_120b, tokens):
    from gossamer.kernels import moe_mxfp4

    x = torch.randn(tokens, H_120B, device="cuda").bfloat16()
    logits = _tied_logits_120b(tokens, seed=100 + tokens)
    ids, route_w, x_h, x_unscale = moe_mxfp4.route_fp16(logits, TOP_K_120B, x)
    act_exp = moe_mxfp4.act_exponent(LIMIT)
    common = (lanes_120b, I_120B, TOP_K_120B, LIMIT, ALPHA, act_exp,
              moe_mxfp4.DECODE_FP16_GATE_UP)  # fmt: skip
    act = moe_mxfp4._fp16_gate_up(x_h, x_unscale, ids, *common)
    assert torch.equal(moe_mxfp4._fp16_gate_up(x_h, x_unscale, None, *common, logits), act)
    out, routed = torch.empty_like(x), torch.empty_like(x)
    down = (I_120B, TOP_K_120B, act_exp, moe_mxfp4.DECODE_FP16_DOWN)
    moe_mxfp4._fp16_down(act, ids, route_w, lanes_120b, out, *down)
    moe_mxfp4._fp16_down(act, None, None, lanes_120b, routed, *down, logits)
    torch.testing.assert_close(routed, out, rtol=1e-2, atol=1e-2 * out.abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 4, 8, 9])
def test_gpu_120b_norm_moe_switched_on_equals_off(lanes_120b, monkeypatch, tokens):
    """TritonOps.norm_moe on 120b shapes with the switch on against off (T = 9 is past the GEMV
    path: it falls through to the default path)."""
    from gossamer.kernels import moe_mxfp4

    problem = _problem_120b(tokens, seed=200 + tokens)
    off, on, calls = _norm_moe_on_and_off(triton_ops.TritonOps(), monkeypatch, problem,
                                          lanes_120b)  # fmt: skip
    assert len(calls) == (1 if tokens * TOP_K_120B <= moe_mxfp4.DECODE_MAX_PAIRS else 0)
    assert torch.equal(on[1], off[1])
    torch.testing.assert_close(on[0], off[0], rtol=1e-2, atol=1e-2 * off[0].abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 4])
def test_gpu_120b_norm_moe_switched_on_captures_in_a_cuda_graph(lanes_120b, monkeypatch, tokens):
    """The switched-on path has no host syncs: it captures, and replays on new inputs as eager."""
    from gossamer.kernels import moe_mxfp4

    monkeypatch.setattr(moe_mxfp4, "ROUTE_IN_GEMV", True)
    ops = triton_ops.TritonOps()
    static = [t.clone() for t in _problem_120b(tokens, seed=300 + tokens)]

    def step():
        hidden, residual, norm_weight, router_weight, router_bias = static
        return ops.norm_moe(hidden, residual, norm_weight, EPS, router_weight, router_bias,
                            lanes_120b, TOP_K_120B, LIMIT, ALPHA)  # fmt: skip

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out, static_residual = step()
    for tensor, new in zip(static, _problem_120b(tokens, seed=400 + tokens), strict=True):
        tensor.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    out, new_residual = step()
    assert torch.equal(static_out, out) and torch.equal(static_residual, new_residual)
