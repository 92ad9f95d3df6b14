"""The GPU path of the trainer (torch.compile, bf16 autocast, fused AdamW, QAT recompilation).

Run on the device before a real training run: `python -m pytest tests/mini -m gpu`.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from tools.mini.model import MiniGptOss, init_weights
from tools.mini.train import TINY_MODEL, TINY_SETTINGS, Trainer, loss_terms

pytestmark = pytest.mark.gpu


def make_trainer(compile: bool) -> Trainer:
    config = replace(TINY_MODEL, head_dim=64, hidden_size=128, num_attention_heads=8)
    settings = replace(TINY_SETTINGS, compile=compile, dropout=0.0, seq_len=256, batch_size=4)
    model = MiniGptOss(config, dropout=0.0)
    init_weights(model, seed=0)
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, 20_000).astype(np.uint16)
    return Trainer(model.cuda(), settings, tokens, tokens[:2_000], "cuda")


def test_compiled_training_matches_eager_and_survives_the_qat_switch():
    compiled, eager = make_trainer(compile=True), make_trainer(compile=False)
    for step in range(3):
        compiled_loss, _ = compiled.train_step(step)
        eager_loss, _ = eager.train_step(step)
        assert compiled_loss == pytest.approx(eager_loss, rel=2e-2)
    compiled.model.set_fake_quantize(True)
    eager.model.set_fake_quantize(True)
    compiled_loss, _ = compiled.train_step(3)
    eager_loss, _ = eager.train_step(3)
    assert compiled.compiled, "torch.compile fell back to eager"
    assert compiled_loss == pytest.approx(eager_loss, rel=2e-2)


def test_evaluation_under_autocast_matches_float32():
    trainer = make_trainer(compile=False)
    bf16_loss = trainer.evaluate()
    with torch.no_grad():
        batch = trainer.val_windows[:4].cuda()
        ce, _ = loss_terms(trainer.model.eval(), batch)
    assert bf16_loss == pytest.approx(ce.item(), rel=2e-2)
