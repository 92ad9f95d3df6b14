"""Tiny EAGLE-3 checkpoints in the published layout (config.json + safetensors), for tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def write_eagle3_checkpoint(
    path: Path,
    *,
    vocab_size: int,
    target_hidden_size: int,
    aux_layer_ids: tuple[int, ...],
    draft_vocab: list[int] | None = None,
    hidden_size: int | None = None,
    seed: int = 0,
    own_embedding: bool = False,
    prefix: str = "",
    norm_before_residual: bool = False,
    rope_scaling: dict | None = None,
    constant_draft: bool = False,
    head_dim: int = 16,
) -> Path:
    """Random weights. `draft_vocab`: the target ids of the reduced vocabulary (d2t holds
    target - draft id). `constant_draft`: a zero final norm, so the head always proposes
    draft id 0 (= draft_vocab[0])."""
    hidden = hidden_size or target_hidden_size
    heads, kv_heads, inter = 4, 2, 48
    draft_size = len(draft_vocab) if draft_vocab is not None else vocab_size
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": inter,
        "num_hidden_layers": 1,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": rope_scaling,
        "vocab_size": vocab_size,
        "draft_vocab_size": draft_size,
        "target_hidden_size": target_hidden_size,
        "norm_before_residual": norm_before_residual,
        "max_position_embeddings": 4096,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux_layer_ids)},
        "tie_word_embeddings": False,
    }
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float = 0.2) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    tensors = {
        "fc.weight": rand(hidden, 3 * target_hidden_size, scale=0.1),
        "midlayer.input_layernorm.weight": 1 + rand(hidden, scale=0.1),
        "midlayer.hidden_norm.weight": 1 + rand(hidden, scale=0.1),
        "midlayer.post_attention_layernorm.weight": 1 + rand(hidden, scale=0.1),
        "midlayer.self_attn.q_proj.weight": rand(heads * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": rand(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": rand(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": rand(hidden, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": rand(inter, hidden),
        "midlayer.mlp.up_proj.weight": rand(inter, hidden),
        "midlayer.mlp.down_proj.weight": rand(hidden, inter),
        "norm.weight": torch.zeros(hidden) if constant_draft else 1 + rand(hidden, scale=0.1),
        "lm_head.weight": rand(draft_size, hidden, scale=0.5),
    }
    if draft_vocab is not None:
        ids = torch.tensor(draft_vocab, dtype=torch.long)
        tensors["d2t"] = ids - torch.arange(draft_size)
        t2d = torch.zeros(vocab_size, dtype=torch.bool)
        t2d[ids] = True
        tensors["t2d"] = t2d
    if own_embedding:
        tensors["embed_tokens.weight"] = rand(vocab_size, hidden, scale=1.0)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(
        {prefix + name: t.contiguous() for name, t in tensors.items()}, path / "model.safetensors"
    )
    return path
