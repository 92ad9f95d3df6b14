"""The training twin computes transformers' GptOssForCausalLM, and its checkpoints mean that."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gossamer.model import mxfp4
from tools.mini.evaluate import load_hf_model
from tools.mini.export import convert_directly, convert_to_mxfp4, export_bf16
from tools.mini.model import (
    MiniConfig,
    MiniGptOss,
    init_weights,
    mxfp4_round_trip,
    straight_through,
    yarn_inverse_frequencies,
)
from tools.mini.train import loss_terms


def random_model(config: MiniConfig, seed: int = 0, dropout: float = 0.0) -> MiniGptOss:
    """Weights with every term exercised (biases, sinks, norms not at their init values), rounded
    to bfloat16 so that the bfloat16 checkpoint holds them exactly."""
    torch.manual_seed(seed)
    model = MiniGptOss(config, dropout=dropout)
    init_weights(model, std=0.1, seed=seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("bias", "sinks", "norm.weight")):
                param.add_(0.3 * torch.randn_like(param))
            param.copy_(param.to(torch.bfloat16).float())
    return model.eval()


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_config, tokenizer_path) -> tuple[MiniGptOss, Path]:
    model = random_model(tiny_config)
    folder = tmp_path_factory.mktemp("bf16")
    export_bf16(model, tokenizer_path, folder)
    return model, folder


def test_logits_equal_transformers_from_the_exported_checkpoint(exported, tiny_config):
    from transformers import GptOssForCausalLM

    model, folder = exported
    hf, info = GptOssForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    # 40 tokens: well past the sliding window (8) of the even layers.
    ids = torch.randint(
        0, tiny_config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        ours, theirs = model(ids), hf.eval()(ids).logits
    assert theirs.abs().max() > 1.0  # a real signal, not near-zero logits
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def test_mxfp4_checkpoint_equals_the_fake_quantised_model(exported, tiny_config, tmp_path):
    model, folder = exported
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the project's writer must work, not the fallback
        convert_to_mxfp4(folder, tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    blocks = tensors["model.layers.0.mlp.experts.gate_up_proj_blocks"]
    experts, hidden, inter = (
        tiny_config.num_local_experts,
        tiny_config.hidden_size,
        tiny_config.intermediate_size,
    )
    assert blocks.dtype == torch.uint8 and blocks.shape == (experts, 2 * inter, hidden // 32, 16)
    assert "model.layers.0.mlp.experts.gate_up_proj" not in tensors
    ids = torch.randint(
        0, tiny_config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(2)
    )
    hf = load_hf_model(tmp_path)  # experts unpacked by transformers' own MXFP4 code
    model.set_fake_quantize(True)
    try:
        with torch.no_grad():
            ours, theirs = model(ids), hf(ids).logits
    finally:
        model.set_fake_quantize(False)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    with torch.no_grad():
        assert (model(ids) - theirs).abs().max() > 1e-3  # quantisation did change the function


def test_fallback_writer_writes_what_the_project_writer_writes(exported, tmp_path):
    _, folder = exported
    convert_to_mxfp4(folder, tmp_path / "project")
    convert_directly(folder, tmp_path / "direct")
    project = load_file(tmp_path / "project" / "model.safetensors")
    direct = load_file(tmp_path / "direct" / "model.safetensors")
    assert project.keys() == direct.keys()
    for name, tensor in project.items():
        assert tensor.dtype == direct[name].dtype and torch.equal(tensor, direct[name]), name


def test_fake_quantisation_is_the_project_quantizer(tiny_config):
    generator = torch.Generator().manual_seed(3)
    # [E, in, out] with blocks along `in` of very different magnitudes, one block all zero, and
    # exact e2m1 midpoints (ties) inside.
    weight = torch.randn(2, 64, 8, generator=generator) * torch.logspace(-3, 1, 8)
    weight[0, :32, 0] = 0.0
    weight[1, :4, 1] = torch.tensor([6.0, 0.25, 0.75, 2.5])
    weight = weight.to(torch.bfloat16).float()
    ours = mxfp4_round_trip(weight, dim=1)
    blocks, scales = mxfp4.quantize(weight.transpose(1, 2))
    theirs = mxfp4.dequantize(blocks, scales, torch.float32).transpose(1, 2)
    assert torch.equal(ours, theirs)
    assert not torch.equal(ours, weight)


def test_straight_through_gradient_is_identity():
    weight = torch.randn(2, 32, 4, requires_grad=True)
    upstream = torch.randn(2, 32, 4)
    (straight_through(weight, 1) * upstream).sum().backward()
    assert torch.equal(weight.grad, upstream)


def test_yarn_frequencies_equal_transformers(tiny_config):
    from transformers import GptOssConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_config = GptOssConfig(head_dim=64, num_attention_heads=8, hidden_size=384)
    expected, expected_scaling = ROPE_INIT_FUNCTIONS["yarn"](hf_config, "cpu")
    inv_freq, scaling = yarn_inverse_frequencies(MiniConfig(head_dim=64))
    torch.testing.assert_close(inv_freq, expected.float(), rtol=1e-6, atol=0)
    assert scaling == pytest.approx(expected_scaling)


def test_dropout_acts_in_training_only(tiny_config):
    plain = random_model(tiny_config, dropout=0.0)
    dropped = random_model(tiny_config, dropout=0.5)
    ids = torch.randint(
        0, tiny_config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(4)
    )
    with torch.no_grad():
        assert torch.equal(plain(ids), dropped(ids))
        assert not torch.equal(plain(ids), dropped.train()(ids))


def test_training_steps_reduce_the_loss_and_reach_every_parameter(tiny_config):
    model = random_model(tiny_config).train()
    batch = torch.randint(
        0, tiny_config.vocab_size, (2, 33), generator=torch.Generator().manual_seed(5)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(12):
        ce, balance = loss_terms(model, batch)
        optimizer.zero_grad()
        (ce + 0.01 * balance).backward()
        if not losses:
            silent = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()]
            assert not silent, f"no gradient reaches {silent}"
        optimizer.step()
        losses.append(ce.item())
    assert losses[-1] < 0.7 * losses[0]
