"""The whole pipeline in --tiny mode on CPU: corpus -> tokenizer -> train -> MXFP4 -> evaluate."""

from __future__ import annotations

import json
import math
import shutil

import pytest
from safetensors import safe_open
from tokenizers import Tokenizer

from gossamer.config import ModelConfig
from tools.mini.export import folder_bytes
from tools.mini.train import main


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    out, work = str(root / "model"), str(root / "work")
    # Shards of 0.1 MB: the tiny weights (0.2 MB) take the sharded path of the real run.
    main(["--tiny", "--device", "cpu", "--max-shard-mb", "0.1", "--out", out, "--work", work])
    return root / "model"


def test_checkpoint_folder_is_complete_and_self_consistent(tiny_run):
    names = {p.name for p in tiny_run.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", "README.md"} <= names
    config = ModelConfig.from_hf(tiny_run)
    tokenizer = Tokenizer.from_file(str(tiny_run / "tokenizer.json"))
    assert config.vocab_size == tokenizer.get_vocab_size()
    stops = [tokenizer.token_to_id(t) for t in ("<|return|>", "<|endoftext|>", "<|call|>")]
    assert list(config.eos_token_ids) == stops
    assert json.loads((tiny_run / "generation_config.json").read_text())["eos_token_id"] == stops
    index = json.loads((tiny_run / "model.safetensors.index.json").read_text())["weight_map"]
    shards = sorted(tiny_run.glob("model-*-of-*.safetensors"))
    assert len(shards) >= 2 and {p.name for p in shards} == set(index.values())
    keys = set()
    for shard in shards:
        with safe_open(str(shard), framework="pt") as f:
            keys |= set(f.keys())
    assert keys == set(index)
    assert "model.layers.0.mlp.experts.down_proj_blocks" in keys
    assert not any(k.endswith("experts.down_proj") for k in keys)
    assert folder_bytes(tiny_run) < 25_000_000


def test_training_learned_and_the_export_keeps_what_was_learned(tiny_run):
    metrics = json.loads((tiny_run / "metrics.json").read_text())
    history = metrics["history"]
    assert history[-1]["val_loss"] < history[0]["val_loss"]
    assert metrics["training"]["decay_start_step"] is not None
    # The trainer's own (fake-quantised, float32) validation loss of the exported weights and
    # transformers' loss on the packed checkpoint agree up to bfloat16 rounding of the export.
    hf_val = metrics["eval"]["val"]["loss"]
    assert math.isfinite(hf_val)
    assert hf_val == pytest.approx(metrics["training"]["best_val_loss"], abs=0.02)
    assert metrics["eval"]["test"]["bits_per_byte"] > 0


def test_model_card_is_filled_in(tiny_run):
    card = (tiny_run / "README.md").read_text()
    assert "{{" not in card and "gpt-oss-mini" in card


def test_gossamer_loads_the_shipped_checkpoint(tiny_run):
    from gossamer.model.loader import load_model

    loaded = load_model(str(tiny_run), device="cpu", dtype="float32")
    assert loaded.model.mxfp4 and loaded.config.num_hidden_layers == 2


def test_merged_shards_hold_the_same_model(tiny_run, tmp_path):
    import torch

    from tools.mini.evaluate import load_hf_model
    from tools.mini.export import merge_shards

    merged = tmp_path / "merged"
    shutil.copytree(tiny_run, merged)
    merge_shards(merged)
    assert sorted(p.name for p in merged.glob("model*")) == ["model.safetensors"]
    ids = torch.arange(24).view(2, 12)
    with torch.no_grad():
        torch.testing.assert_close(
            load_hf_model(merged)(ids).logits, load_hf_model(tiny_run)(ids).logits
        )


def test_gossamer_tokenizer_finds_the_harmony_tokens_by_name(tiny_run):
    from gossamer.tokenizer import Tokenizer as GossamerTokenizer

    tokenizer = GossamerTokenizer.from_file(tiny_run / "tokenizer.json")
    reference = Tokenizer.from_file(str(tiny_run / "tokenizer.json"))
    for name in ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>"):
        assert tokenizer.special_id(name) == reference.token_to_id(name)
    text = "def f(x):\n    return x  # ok"
    assert tokenizer.encode(text) == reference.encode(text).ids
