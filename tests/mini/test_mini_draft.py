"""The draft-model recipe (`tools.mini.train --preset draft`) in --tiny mode on CPU: the folder it
writes shares gpt-oss-mini's tokenizer and vocabulary, loads through gossamer's loader, and drafts
for gpt-oss-mini in the engine without changing greedy outputs."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors import safe_open
from tokenizers import Tokenizer

from gossamer.config import ModelConfig
from gossamer.model.loader import load_model
from gossamer.models import default_model_path
from gossamer.spec.config import SpecConfig
from tools.eagle3.train_mini import compare_outputs, generate
from tools.mini.draft import distillation_terms
from tools.mini.export import mini_config_from, model_config
from tools.mini.model import MiniGptOss, init_weights
from tools.mini.train import SAMPLE_PROMPTS, loss_terms, main

TARGET = default_model_path()


@pytest.fixture(scope="module")
def draft(tmp_path_factory):
    """A tiny draft, distilled (the teacher path included), trained for a few steps."""
    root = tmp_path_factory.mktemp("draft")
    args = ["--preset", "draft", "--tiny", "--device", "cpu", "--distill", "0.5"]
    main([*args, "--max-files", "8", "--out", str(root / "out"), "--work", str(root / "work")])
    return root / "out"


def test_draft_shares_the_targets_tokenizer_and_vocabulary(draft):
    assert (draft / "tokenizer.json").read_bytes() == (TARGET / "tokenizer.json").read_bytes()
    ours, theirs = ModelConfig.from_hf(draft), ModelConfig.from_hf(TARGET)
    assert ours.vocab_size == theirs.vocab_size
    assert ours.eos_token_ids == theirs.eos_token_ids and ours.pad_token_id == theirs.pad_token_id
    generation = "generation_config.json"
    assert json.loads((draft / generation).read_text()) == json.loads(
        (TARGET / generation).read_text()
    )
    metrics = json.loads((draft / "metrics.json").read_text())
    digest = hashlib.sha256((TARGET / "tokenizer.json").read_bytes()).hexdigest()
    assert metrics["target"]["tokenizer_sha256"] == digest


def test_draft_is_a_smaller_gpt_oss_that_gossamer_loads(draft):
    loaded = load_model(str(draft), device="cpu", dtype="float32")
    config, target = loaded.config, ModelConfig.from_hf(TARGET)
    assert loaded.model.mxfp4
    assert config.num_hidden_layers < target.num_hidden_layers
    assert config.layer_types == ("sliding_attention", "full_attention")
    assert config.rope_scaling == target.rope_scaling  # YaRN, as the target
    with safe_open(str(draft / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
    assert {"model.layers.0.self_attn.sinks", "model.layers.1.mlp.experts.down_proj_blocks"} <= keys
    assert not any(k.endswith("experts.down_proj") for k in keys)


def test_training_learned_and_the_card_and_agreement_are_written(draft):
    metrics = json.loads((draft / "metrics.json").read_text())
    assert metrics["settings"]["distill"] == 0.5
    history = metrics["history"]
    assert history[-1]["val_loss"] < history[0]["val_loss"]
    assert 0 <= metrics["agreement"]["top1_agreement"] <= 1
    assert metrics["agreement"]["tokens"] > 0
    card = (draft / "README.md").read_text()
    assert "{{" not in card and "draft" in card


def test_greedy_decoding_with_the_draft_equals_plain_decoding(draft):
    target = load_model(str(TARGET), dtype="float32", ops="torch", max_model_len=512).model
    tokenizer = Tokenizer.from_file(str(TARGET / "tokenizer.json"))
    prompts = [tokenizer.encode(p, add_special_tokens=False).ids for p in SAMPLE_PROMPTS.values()]
    spec = SpecConfig(
        method="draft",
        model=str(draft),
        num_speculative_tokens=3,
        min_acceptance_rate=0.0,  # keep drafting however poor the tiny draft is
    )
    plain, _, _ = generate(target, prompts, 16, None)
    drafted, stats, _ = generate(target, prompts, 16, spec)
    comparison = compare_outputs(plain, drafted)
    assert comparison["identical"] == comparison["total"] == len(prompts)
    assert stats["num_draft_tokens"] > 0


def test_mini_config_from_inverts_model_config(tiny_config, tokenizer_path):
    written = model_config(tiny_config, Tokenizer.from_file(str(tokenizer_path)))
    assert mini_config_from(written) == tiny_config


def test_distillation_weights_the_corpus_and_the_teachers_distribution(tiny_config):
    student, teacher = MiniGptOss(tiny_config).eval(), MiniGptOss(tiny_config).eval()
    init_weights(student, seed=1)
    init_weights(teacher, seed=2)
    batch = torch.randint(
        0, tiny_config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        corpus_ce, balance = loss_terms(student, batch)
        only_corpus, distill_balance = distillation_terms(teacher, 0.0)(student, batch)
        # the teacher against itself: the soft cross entropy is its own entropy
        own, _ = distillation_terms(teacher, 1.0)(teacher, batch)
        probs = teacher(batch[:, :-1]).float().softmax(-1)
        entropy = -(probs * probs.log()).sum(-1).mean()
        half, _ = distillation_terms(teacher, 0.5)(student, batch)
        soft, _ = distillation_terms(teacher, 1.0)(student, batch)
    torch.testing.assert_close(only_corpus, corpus_ce)
    torch.testing.assert_close(distill_balance, balance)
    torch.testing.assert_close(own, entropy)
    assert soft > entropy  # cross entropy exceeds entropy when the student differs
    torch.testing.assert_close(half, 0.5 * corpus_ce + 0.5 * soft)
