"""Cache groups from a model config, and the memory arithmetic of the KV tensor."""

from __future__ import annotations

import pytest
import torch

from gossamer.cache import (
    KVCacheLayout,
    KVCacheManager,
    dtype_num_bytes,
    kv_block_bytes,
    num_blocks_for_memory,
)
from gossamer.config import FULL, SLIDING, ModelConfig
from gossamer.presets import preset


def test_gpt_oss_has_a_full_and_a_sliding_group():
    config = preset("gpt-oss-20b")
    layout = KVCacheLayout.from_model_config(config)
    full, sliding = layout.groups
    assert full.sliding_window is None and sliding.sliding_window == 128
    assert full.layer_ids == tuple(range(1, 24, 2)) and sliding.layer_ids == tuple(range(0, 24, 2))
    assert layout.layers_per_group == 12
    for layer, (group, slot) in enumerate(layout.layer_slots):
        assert layout.groups[group].layer_ids[slot] == layer
        assert layout.groups[group].is_sliding == config.is_sliding(layer)


def test_models_without_sliding_layers_get_one_group():
    config = ModelConfig(num_hidden_layers=3, layer_types=(FULL, FULL, FULL))
    layout = KVCacheLayout.from_model_config(config)
    assert len(layout.groups) == 1 and layout.layers_per_group == 3
    merged = KVCacheLayout.from_model_config(preset("gpt-oss-20b"), separate_sliding_group=False)
    assert len(merged.groups) == 1 and not merged.groups[0].is_sliding
    odd = KVCacheLayout.from_model_config(
        ModelConfig(num_hidden_layers=3, layer_types=(SLIDING, FULL, SLIDING))
    )
    assert odd.layers_per_group == 2 and odd.layer_slots == ((1, 0), (0, 0), (1, 1))
    manager = KVCacheManager.from_layout(odd, 10)
    assert manager.num_groups == 2


def test_block_bytes_match_the_torch_tensor():
    layout = KVCacheLayout.from_model_config(preset("gpt-oss-120b"))
    num_blocks, block_size, kv_heads, head_dim = 5, 16, 8, 64
    kv = torch.empty(
        layout.layers_per_group, 2, num_blocks, block_size, kv_heads, head_dim, dtype=torch.bfloat16
    )
    per_block = kv_block_bytes(
        layers_per_group=layout.layers_per_group,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=torch.bfloat16,
    )
    assert per_block * num_blocks == kv.nbytes
    budget = kv.nbytes + per_block - 1
    args = dict(layers_per_group=18, num_kv_heads=8, head_dim=64, block_size=16)
    assert num_blocks_for_memory(budget, dtype="bfloat16", **args) == num_blocks
    assert num_blocks_for_memory(budget, dtype=torch.float8_e4m3fn, **args) == 2 * num_blocks + 1


def test_dtype_names():
    assert dtype_num_bytes(torch.float32) == dtype_num_bytes("fp32") == 4
    assert dtype_num_bytes("torch.bfloat16") == 2 and dtype_num_bytes(1) == 1
    with pytest.raises(ValueError, match="unknown KV cache dtype"):
        dtype_num_bytes("int3")
