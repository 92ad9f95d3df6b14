"""Tiny random GPT-OSS checkpoints written by transformers itself: the oracle for model tests."""

from __future__ import annotations

from pathlib import Path

import torch

TINY = dict(
    num_hidden_layers=3,
    num_local_experts=4,
    num_experts_per_tok=2,
    hidden_size=64,
    intermediate_size=64,
    head_dim=16,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=320,
    sliding_window=8,
    max_position_embeddings=4096,
)


def write_hf_model(path: Path, seed: int, **overrides) -> Path:
    """Save a random transformers GptOssForCausalLM (float32) and return its folder."""
    from transformers import GptOssConfig, GptOssForCausalLM

    torch.manual_seed(seed)
    config = GptOssConfig(**(TINY | overrides))
    model = GptOssForCausalLM(config)
    # Random (not zero) biases and norm weights, so that every term is exercised.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "bias" in name or "norm" in name or "sinks" in name:
                param.add_(0.1 * torch.randn_like(param))
    model.save_pretrained(path)
    return path


def load_hf_model(path: Path, dtype: torch.dtype = torch.float32):
    from transformers import GptOssForCausalLM

    model = GptOssForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager")
    return model.eval()
