"""Shared fixtures for the gpt-oss-mini tests: a small trained tokenizer and tiny model configs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tokenizers import AddedToken, Tokenizer, pre_tokenizers, trainers

from tools.mini.chat import SPECIAL_TOKENS
from tools.mini.model import MiniConfig
from tools.mini.tokenizer import new_tokenizer

TINY_CONFIG = dict(
    hidden_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_local_experts=4,
    num_experts_per_tok=2,
    intermediate_size=32,
    sliding_window=8,
)


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE (the real pipeline, small data) with the Harmony specials at the end."""
    tokenizer = new_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(["def hello(world):\n    return world  # hello"] * 20, trainer)
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


@pytest.fixture(scope="session")
def tiny_config(tokenizer_path: Path) -> MiniConfig:
    vocab = Tokenizer.from_file(str(tokenizer_path)).get_vocab_size()
    return MiniConfig(vocab_size=vocab, **TINY_CONFIG)


@pytest.fixture(autouse=True)
def single_thread():
    """Tiny shapes: one thread is fastest, and far faster when other processes share the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
