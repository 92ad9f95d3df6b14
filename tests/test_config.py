from __future__ import annotations

import json

import pytest
import torch

from gossamer.config import FULL, SLIDING, ConfigError, ModelConfig
from gossamer.model.rope import inverse_frequencies
from gossamer.presets import preset


def test_official_values_of_the_presets():
    big, small = preset("gpt-oss-120b"), preset("openai/gpt-oss-20b")
    assert (big.num_hidden_layers, big.num_local_experts) == (36, 128)
    assert (small.num_hidden_layers, small.num_local_experts) == (24, 32)
    for cfg in (big, small):
        assert cfg.layer_types[0] == SLIDING and cfg.layer_types[1] == FULL
        assert cfg.sliding_window == 128 and cfg.num_experts_per_tok == 4
        assert cfg.rope_scaling.factor == 32 and cfg.rope_scaling.truncate is False
        assert (cfg.hidden_size, cfg.head_dim, cfg.vocab_size) == (2880, 64, 201088)


def test_from_hf_reads_what_transformers_writes(tmp_path):
    from transformers import GptOssConfig

    GptOssConfig(num_hidden_layers=5, sliding_window=64, num_local_experts=16).save_pretrained(
        tmp_path
    )
    cfg = ModelConfig.from_hf(tmp_path)
    assert cfg.num_hidden_layers == 5 and cfg.sliding_window == 64
    assert cfg.num_local_experts == 16 and cfg.layer_types[4] == SLIDING
    assert cfg.rope_theta == 150000 and cfg.rope_scaling.original_max_position_embeddings == 4096


def test_to_hf_round_trips_through_transformers(tmp_path):
    from transformers import GptOssConfig

    ours = preset("gpt-oss-20b")
    (tmp_path / "config.json").write_text(json.dumps(ours.to_hf()))
    theirs = GptOssConfig.from_pretrained(tmp_path)
    assert ModelConfig.from_hf(theirs.to_dict()) == ours
    assert ModelConfig.from_hf(tmp_path) == ours


def test_v4_style_rope_scaling_is_read():
    raw = preset("gpt-oss-120b").to_hf()
    raw.pop("rope_parameters")
    raw["rope_scaling"] = {
        "rope_type": "yarn",
        "factor": 16.0,
        "beta_fast": 8,
        "beta_slow": 2,
        "original_max_position_embeddings": 2048,
        "truncate": False,
    }
    cfg = ModelConfig.from_hf(raw)
    assert cfg.rope_scaling.factor == 16 and cfg.rope_scaling.beta_fast == 8


def test_wrong_model_type_is_a_clear_error():
    with pytest.raises(ConfigError, match="gpt_oss"):
        ModelConfig.from_hf({"model_type": "llama"})


def test_yarn_frequencies_match_transformers_for_the_real_head_dim():
    from transformers import GptOssConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    theirs, their_scale = ROPE_INIT_FUNCTIONS["yarn"](GptOssConfig(), "cpu")
    ours, our_scale = inverse_frequencies(preset("gpt-oss-120b"))
    assert torch.allclose(ours, theirs, rtol=1e-6, atol=0)
    assert our_scale == pytest.approx(their_scale)
