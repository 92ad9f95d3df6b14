"""benchmarks/fusion_ab.py's knock-outs: which 1-token calls they cut, and that they undo."""

from __future__ import annotations

import sys

import pytest
import torch

from gossamer.model.loader import load_model
from tests.benchmarks.conftest import BENCHMARKS


@pytest.fixture
def bench(benchmark_script, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # it imports its siblings (decode_speed, timing)
    yield benchmark_script("fusion_ab")
    sys.modules.pop("decode_speed", None)
    sys.modules.pop("timing", None)


@pytest.fixture(scope="module")
def mini():
    return load_model("gossamer/models/gpt-oss-mini", load_format="dummy", dtype="float32").model


def _projections(model) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    layer = model.model.layers[0]
    return {
        "qkv": (layer.self_attn.qkv_proj.weight, layer.self_attn.qkv_proj.bias),
        "o": (layer.self_attn.o_proj.weight, layer.self_attn.o_proj.bias),
        "router": (layer.mlp.router.weight, layer.mlp.router.bias),
        "unembed": (model.lm_head.weight, None),
    }


@pytest.mark.parametrize("part", ["qkv", "o", "router", "unembed"])
def test_a_knocked_out_projection_is_a_fixed_buffer_at_one_token(bench, mini, part):
    projections = _projections(mini)
    inputs = {name: torch.randn(2, w.shape[1]) for name, (w, _) in projections.items()}
    real = {name: mini.ops.linear(inputs[name], *wb) for name, wb in projections.items()}
    bench.knock_out(mini, part)
    try:
        for name, (weight, bias) in projections.items():
            one = mini.ops.linear(inputs[name][:1], weight, bias)
            assert one.shape == (1, weight.shape[0])
            if name == part:  # the same buffer every call: nothing launched
                assert one is mini.ops.linear(inputs[name][:1], weight, bias)
                assert not torch.allclose(one, real[name][:1])
            else:
                torch.testing.assert_close(one, real[name][:1])
            torch.testing.assert_close(mini.ops.linear(inputs[name], weight, bias), real[name])
    finally:
        bench.knock_out(mini, None)
    assert "linear" not in vars(mini.ops)


def test_knocked_out_norms_attention_and_experts_pass_their_input(bench, mini):
    hidden = mini.config.hidden_size
    x, residual, weight = torch.randn(1, hidden), torch.randn(1, hidden), torch.ones(hidden)
    bench.knock_out(mini, "norms")
    assert mini.ops.rms_norm(x, weight, 1e-5, residual) == (x, residual)
    assert mini.ops.rms_norm(x, weight, 1e-5)[1] is x
    two = torch.randn(2, hidden)
    torch.testing.assert_close(mini.ops.rms_norm(two, weight, 1e-5)[0],
                               two * torch.rsqrt(two.pow(2).mean(-1, keepdim=True) + 1e-5))  # fmt: skip
    bench.knock_out(mini, "attention")
    assert "rms_norm" not in vars(mini.ops)
    q = torch.randn(1, mini.config.num_attention_heads, mini.config.head_dim)
    assert mini.ops.rope_write_kv_attention(q, None, None) is q
    bench.knock_out(mini, "experts")
    assert mini.ops.moe(x, None, None, 4, 7.0, 1.702) is x
    bench.knock_out(mini, None)
    assert not {"rms_norm", "rope_write_kv_attention", "moe"} & set(vars(mini.ops))
    with pytest.raises(ValueError, match="knock-out"):
        bench.knock_out(mini, "lm")


def test_variants_set_the_moe_and_gemv_configs_and_the_defaults_restore_them(bench, mini):
    defaults = bench.current_defaults()
    from gossamer.kernels import gemv, moe_mxfp4, norm

    try:
        bench.apply(mini, bench.VARIANTS["gate_up_early"], defaults)
        assert moe_mxfp4.DECODE_FP16_GATE_UP == defaults["gate_up"] | {"EARLY": 1}
        assert moe_mxfp4.DECODE_FP16_DOWN == defaults["down"]
        bench.apply(mini, bench.VARIANTS["no_packed"], defaults)
        assert not gemv.USE_PACKED and defaults["packed"]
        bench.apply(mini, bench.VARIANTS["packed_64x128w4p4"], defaults)
        assert gemv.USE_PACKED and gemv.default_config(1, 5120, 2880).block_n == 64
        assert gemv.default_config(1, 2880, 4096).block_k == 128
        bench.apply(mini, bench.VARIANTS["routing_kernel"], defaults)
        assert not moe_mxfp4.ROUTE_IN_EXPERTS and defaults["route_in_experts"]
        bench.apply(mini, bench.VARIANTS["ko_router"], defaults)  # the knock-outs: routed path
        assert not moe_mxfp4.ROUTE_IN_EXPERTS
        bench.apply(mini, bench.VARIANTS["dn_r2w2"] | bench.VARIANTS["norm_w4"], defaults)
        assert moe_mxfp4.DECODE_FP16_DOWN == defaults["down"] | {"BLOCK_ROWS": 2, "num_warps": 2}
        assert norm.NUM_WARPS == 4 and moe_mxfp4.ROUTE_IN_EXPERTS
        bench.apply(mini, bench.VARIANTS["whole_4_scales_t_routing"], defaults)
        assert moe_mxfp4.ROUTING_GEMV_CHANGES == {} != defaults["routing_gemv_changes"]
        assert moe_mxfp4.DECODE_FP16_DOWN == defaults["down"] | {"WHOLE_STEPS": 4}
        bench.apply(mini, bench.VARIANTS["dense_pf_all"], defaults)
        assert gemv.USE_PACKED == defaults["packed"] and norm.NUM_WARPS == defaults["norm_warps"]
        assert moe_mxfp4.DECODE_FP16_GATE_UP == defaults["gate_up"]
        assert gemv.CONFIGS["tall_m1"].prefetch == gemv.CONFIGS["medium_m1"].prefetch == 16
        assert gemv.default_config(1, 5120, 2880).prefetch == 16  # QKV at batch 1
        assert gemv.default_config(2, 5120, 2880).prefetch == gemv.GemvConfig().prefetch
    finally:
        bench.apply(mini, {}, defaults)
    assert moe_mxfp4.DECODE_FP16_GATE_UP == defaults["gate_up"]
    assert moe_mxfp4.DECODE_FP16_DOWN == defaults["down"]
    assert moe_mxfp4.ROUTING_GEMV_CHANGES == defaults["routing_gemv_changes"]
    assert gemv.CONFIGS == defaults["gemv"] and gemv.CONFIGS["tall_m1"].split_k == 1


def test_a_runner_for_the_servers_context_leaves_the_model_as_it_was(bench, mini):
    """graph_max_len (graph_131k): the runner is built (and its graphs captured) for that context,
    and the model's own max_model_len is back afterwards."""
    assert bench.VARIANTS["graph_131k"]["graph_max_len"] == 131072
    before = mini.max_model_len  # (mini's: 131072 itself, so ask for another)
    runner, seqs = bench.make_runner(mini, 64, 8, graph_max_len=4096)
    assert mini.max_model_len == before
    assert runner.max_blocks_per_seq == 4096 // bench.BLOCK
    assert bench.make_runner(mini, 64, 8)[0].max_blocks_per_seq == -(-before // bench.BLOCK)
    assert len(seqs) == 1 and seqs[0].start == 64
