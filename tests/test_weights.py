"""Checkpoint loading and writing: MXFP4 layout, errors, dummy weights and parameter counts."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from gossamer.config import ConfigError, ModelConfig
from gossamer.engine.reference import ContiguousCache, forward_tokens
from gossamer.model import mxfp4
from gossamer.model.loader import load_model
from gossamer.model.weights import (
    CheckpointError,
    build_model,
    count_parameters,
    save_checkpoint,
    weight_nbytes,
)
from gossamer.ops.torch_ref import TorchOps, expert_matrices
from gossamer.presets import preset
from tests.hf_models import write_hf_model


def test_quantize_then_dequantize_is_exact_on_representable_values():
    codes = torch.randint(0, 16, (3, 64))
    values = torch.tensor(mxfp4.E2M1_VALUES)[codes]
    exponent = torch.randint(-4, 3, (3, 2, 1)).float()
    weight = (values.view(3, 2, 32) * torch.exp2(exponent)).view(3, 64)
    # a block whose max magnitude is not 6 would pick a smaller exponent; force a 6 in each block
    weight.view(3, 2, 32)[..., 0] = 6 * torch.exp2(exponent[..., 0])
    blocks, scales = mxfp4.quantize(weight)
    assert blocks.shape == (3, 2, 16) and scales.shape == (3, 2)
    assert torch.equal(mxfp4.dequantize(blocks, scales, torch.float32), weight)


def test_quantize_error_is_bounded_by_half_a_step():
    weight = torch.randn(8, 128)
    blocks, scales = mxfp4.quantize(weight)
    restored = mxfp4.dequantize(blocks, scales, torch.float32)
    step = torch.exp2(scales.float() - 127).repeat_interleave(
        32, dim=-1
    )  # largest e2m1 gap = 2*scale
    assert ((restored - weight).abs() <= step + 1e-6).all()


def test_written_mxfp4_dequantizes_like_transformers_bit_for_bit(tmp_path):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    hf_dir = write_hf_model(tmp_path / "hf", seed=3)
    dense = load_model(str(hf_dir), dtype="float32").model
    out = save_checkpoint(dense, tmp_path / "mx", experts_format="mxfp4")
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "mxfp4"
    packed = load_model(str(out), dtype="bfloat16").model
    assert packed.mxfp4
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        for layer in range(dense.config.num_hidden_layers):
            prefix = f"model.layers.{layer}.mlp.experts"
            experts = packed.model.layers[layer].mlp.experts.weights()
            for proj in ("gate_up_proj", "down_proj"):
                blocks = f.get_tensor(f"{prefix}.{proj}_blocks")
                scales = f.get_tensor(f"{prefix}.{proj}_scales")
                theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.bfloat16)
                # transformers returns [E, in, out]; ours is [E, out, in]
                for e in range(blocks.shape[0]):
                    ours = expert_matrices(experts, e, torch.bfloat16)[proj == "down_proj"]
                    assert torch.equal(ours, theirs[e].T)


def test_mxfp4_model_logits_track_the_dense_model(tmp_path):
    hf_dir = write_hf_model(tmp_path / "hf", seed=4)
    dense = load_model(str(hf_dir), dtype="float32").model
    packed = load_model(str(save_checkpoint(dense, tmp_path / "mx")), dtype="float32").model
    tokens = list(range(10, 30))
    a = forward_tokens(dense, ContiguousCache(dense, 20), tokens, 0)
    b = forward_tokens(packed, ContiguousCache(packed, 20), tokens, 0)
    assert float((a - b).norm() / a.norm()) < 0.05  # 4-bit experts: close, not equal


def test_sharded_checkpoint_round_trips(tmp_path):
    hf_dir = write_hf_model(tmp_path / "hf", seed=5)
    dense = load_model(str(hf_dir), dtype="float32").model
    out = save_checkpoint(
        dense,
        tmp_path / "sharded",
        experts_format="dense",
        max_shard_bytes=100_000,
        dtype=torch.float32,
    )
    assert (out / "model.safetensors.index.json").is_file()
    assert len(list(out.glob("model-*.safetensors"))) > 2
    again = load_model(str(out), dtype="float32").model
    theirs = again.state_dict()
    for name, tensor in dense.state_dict().items():
        assert torch.equal(tensor, theirs[name]), name


def test_unknown_and_missing_tensors_are_named(tmp_path):
    hf_dir = write_hf_model(tmp_path / "hf", seed=6)
    with safe_open(str(hf_dir / "model.safetensors"), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    tensors["model.layers.0.mystery.weight"] = torch.zeros(2)
    del tensors["model.norm.weight"]
    save_file(tensors, str(hf_dir / "model.safetensors"))
    with pytest.raises(CheckpointError, match="mystery"):
        load_model(str(hf_dir), dtype="float32")
    del tensors["model.layers.0.mystery.weight"]
    save_file(tensors, str(hf_dir / "model.safetensors"))
    with pytest.raises(CheckpointError, match="model.norm.weight"):
        load_model(str(hf_dir), dtype="float32")


@pytest.mark.parametrize(
    "name,billions,packed_gb", [("gpt-oss-120b", 116.8, 65.2), ("gpt-oss-20b", 20.9, 13.8)]
)
def test_presets_construct_on_meta_with_published_sizes(name, billions, packed_gb):
    model = build_model(
        preset(name), TorchOps(), mxfp4_experts=True, dtype=torch.bfloat16, device="meta"
    )
    assert count_parameters(model) / 1e9 == pytest.approx(billions, abs=0.1)
    # 4.25 bits per expert weight + bf16 elsewhere, as the published safetensors (~65 / ~14 GB)
    assert weight_nbytes(model) / 1e9 == pytest.approx(packed_gb, abs=0.5)


def test_dummy_weights_from_a_config_folder_give_finite_varied_logits(tmp_path):
    config = ModelConfig(
        num_hidden_layers=4,
        num_local_experts=8,
        hidden_size=64,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=300,
    )
    (tmp_path / "config.json").write_text(json.dumps(config.to_hf()))
    model = load_model(str(tmp_path), load_format="dummy", dtype="float32", seed=1).model
    assert model.mxfp4
    logits = forward_tokens(model, ContiguousCache(model, 8), list(range(8)), 0)
    assert torch.isfinite(logits).all() and logits.std() > 0.01
    again = load_model(str(tmp_path), load_format="dummy", dtype="float32", seed=1).model
    assert torch.equal(again.lm_head.weight, model.lm_head.weight)  # seeded


def test_preset_without_weights_asks_for_dummy_or_a_path():
    with pytest.raises(ConfigError, match="--load-format dummy"):
        load_model("gpt-oss-20b", device="meta")


@pytest.mark.parametrize(
    "from_env,argument",
    [(None, None), (mxfp4.LAYOUT_LANES_13_9, None), (mxfp4.LAYOUT_LANES_13_9, "lanes_16_8")],
)
def test_repacked_experts_keep_logits_and_save_in_the_published_layout(tmp_path, monkeypatch,
                                                                        from_env, argument):  # fmt: skip
    """repack_experts_for_gpu (the loader runs it for the Triton ops on the GPU), to the layout
    passed (--mxfp4-layout), else GOSSAMER_MXFP4_LAYOUT's, else the default: the torch path reads
    the repacked blocks to the same logits, and saving writes the published layout back."""
    from gossamer.model.weights import hf_state_dict, repack_experts_for_gpu

    if from_env is not None:
        monkeypatch.setenv("GOSSAMER_MXFP4_LAYOUT", from_env)
    layout = argument or from_env or mxfp4.LAYOUT_FP16_LANES

    hf_dir = write_hf_model(tmp_path / "hf", seed=6)
    dense = load_model(str(hf_dir), dtype="float32").model
    packed = load_model(str(save_checkpoint(dense, tmp_path / "mx")), dtype="float32").model
    tokens = list(range(5, 17))
    before = forward_tokens(packed, ContiguousCache(packed, 12), tokens, 0)
    published = {n: t.clone() for n, t in hf_state_dict(packed) if n.endswith("_blocks")}
    assert repack_experts_for_gpu(packed, argument) == packed.config.num_hidden_layers
    assert repack_experts_for_gpu(packed, argument) == 0  # already repacked: nothing changes twice
    experts = packed.model.layers[0].mlp.experts
    assert experts.weights().layout == layout
    assert not torch.equal(experts.gate_up_proj_blocks, published[next(iter(published))])
    after = forward_tokens(packed, ContiguousCache(packed, 12), tokens, 0)
    assert torch.equal(before, after)
    for name, tensor in hf_state_dict(packed):
        if name.endswith("_blocks"):
            assert torch.equal(tensor, published[name]), name


def test_pack_dense_for_gpu_registers_qkv_and_o_in_their_plans_tiles():
    """Each QKV / O weight whose batch-1 plan is a tensor-core tile gets a tile-packed copy of
    exactly that tile (gemv.USE_PACKED then reads it); the rest keep only the row-major weight."""
    from gossamer.kernels import gemv
    from gossamer.model.weights import pack_dense_for_gpu

    model = load_model("gossamer/models/gpt-oss-mini", load_format="dummy", dtype="float32").model
    gemv.clear_packed()
    try:
        expected = []
        for layer in model.model.layers:
            for proj in (layer.self_attn.qkv_proj, layer.self_attn.o_proj):
                config = gemv.default_config(1, *proj.weight.shape)
                if config.kernel == "dot":
                    expected.append((proj.weight, config))
        assert pack_dense_for_gpu(model) == len(expected) > 0
        assert len(gemv._PACKED) == len(expected)
        for weight, config in expected:
            packed = gemv._PACKED[weight.data_ptr(), config.block_n, config.block_k]
            assert packed.source() is weight
            assert torch.equal(
                packed.tiles, gemv.pack_tiles(weight, config.block_n, config.block_k)
            )
    finally:
        gemv.clear_packed()


def test_expert_scales_above_the_kernels_limit_are_refused(tmp_path):
    """The Triton kernels build scales without a clamp, so the loader checks every expert's e8m0
    exponent (a written checkpoint and the limit itself pass; 193 and NaN's 255 do not)."""
    from gossamer.model.weights import check_expert_scales

    hf_dir = write_hf_model(tmp_path / "hf", seed=6)
    dense = load_model(str(hf_dir), dtype="float32").model
    packed = load_model(str(save_checkpoint(dense, tmp_path / "mx")), dtype="float32").model
    layers = packed.config.num_hidden_layers
    assert check_expert_scales(packed) == 2 * layers
    assert check_expert_scales(dense) == 0  # dense experts have no scales
    scales = packed.model.layers[1].mlp.experts.down_proj_scales
    for bad in (mxfp4.KERNEL_MAX_SCALE + 1, 255):
        scales[0, 3, 0] = bad
        with pytest.raises(CheckpointError, match=f"layers.1.mlp.experts.down_proj_scales.*{bad}"):
            check_expert_scales(packed)
    scales[0, 3, 0] = mxfp4.KERNEL_MAX_SCALE
    assert check_expert_scales(packed) == 2 * layers
