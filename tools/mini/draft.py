"""Draft models for gpt-oss-mini: the mini recipe at a smaller size, on its target's tokenizer.

    # one GPU, about 100 s in all (60 s of training); tools/mini/README.md has the benchmark
    python -m tools.mini.train --preset draft --out /tmp/mini-draft
    # the same, distilled from the target (half corpus, half the target's distribution)
    python -m tools.mini.train --preset draft --distill 0.5 --out /tmp/mini-draft-kd
    # CPU smoke test, seconds
    python -m tools.mini.train --preset draft --tiny --out /tmp/mini-draft-tiny

A draft model for speculative decoding (gossamer/spec/draft_model.py) must share its target's
vocabulary. `--target DIR` (the default with `--preset draft`: the built-in gpt-oss-mini) makes
tools/mini/train.py train a draft for that model; what changes against the mini's own run:
- data: the same stdlib corpus, encoded with the target's tokenizer.json, which is copied byte for
  byte into the draft's folder (tools.mini.tokenizer.build_token_data_with) instead of training a
  tokenizer; the draft's vocab_size is the target's;
- model (`--preset draft`, train.DRAFT_MODEL): one sliding-window and one full-attention layer
  instead of 6, hidden 256 instead of 384, 8 experts instead of 16; the same attention shape (8
  query heads, 1 KV head of 64), top-4 routing, sinks, YaRN and MXFP4 experts, so the engine runs
  it through the kernels it runs the target with;
- training (train.DRAFT_SETTINGS): 60 s, eager. torch.compile spent about 37 s compiling
  gpt-oss-mini's step and as long again when the MXFP4 fake quantisation switches on, most of a
  60 s budget; the eager step is slower but starts at once;
- optional distillation (`--distill W`): the loss is (1 - W) x cross entropy on the corpus + W x
  cross entropy against the target's next-token distribution (the forward KL divergence plus the
  target's entropy, a constant); the target runs in the same step, so a step costs about twice;
- measured in addition: how often the draft's top-1 next token is the target's on the test split
  (teacher-forced), and a model card of its own (DRAFT_CARD.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from gossamer.config import ModelConfig
from tools.mini.evaluate import checkpoint_state, windows
from tools.mini.export import mini_config_from
from tools.mini.model import MiniGptOss, cross_entropy, load_balance_loss

LossTerms = Callable[[MiniGptOss, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def load_mini(folder: Path, device: str = "cpu") -> MiniGptOss:
    """A checkpoint folder (MXFP4 or bfloat16 experts) as the training twin: float32, eval mode."""
    model = MiniGptOss(mini_config_from(ModelConfig.from_hf(folder)))
    model.load_state_dict(checkpoint_state(folder), strict=True)
    return model.to(device).eval().requires_grad_(False)


def target_description(target: Path) -> dict:
    """What metrics.json records of the target: where it is, its tokenizer's hash, its shape."""
    config = mini_config_from(ModelConfig.from_hf(target))
    digest = hashlib.sha256((target / "tokenizer.json").read_bytes()).hexdigest()
    return {
        "name": target.name,
        "checkpoint": str(target),
        "tokenizer_sha256": digest,
        "model": asdict(config),
    }


def distillation_terms(teacher: MiniGptOss, weight: float) -> LossTerms:
    """The Trainer's loss terms with the target as teacher: ((1 - weight) x cross entropy on the
    corpus + weight x cross entropy against the teacher's distribution, balance loss)."""

    def terms(model: MiniGptOss, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = batch[:, :-1]
        with torch.no_grad():
            teacher_probs = teacher(inputs).float().softmax(-1)  # [B, T, vocab]
        hidden, router_logits = model.hidden_states(inputs)
        logits = model.lm_head(hidden)  # [B, T, vocab]
        soft = F.cross_entropy(logits.float().flatten(0, 1), teacher_probs.flatten(0, 1))
        hard = cross_entropy(logits, batch[:, 1:])
        balance = load_balance_loss(router_logits, model.config.num_experts_per_tok)
        return (1 - weight) * hard + weight * soft, balance

    return terms


@torch.no_grad()
def top1_agreement(
    draft: Path,
    target: Path,
    tokens: Path,
    split: str,
    *,
    device: str,
    seq_len: int,
    batch_size: int,
    max_tokens: int | None,
) -> dict:
    """How often the draft's most likely next token is the target's, teacher-forced on a split.

    Under greedy verification this is the acceptance rate of a chain's first draft token; later
    ones follow the draft's own guesses and the target's text, not the corpus."""
    draft_model, target_model = load_mini(draft, device), load_mini(target, device)
    batches = windows(np.load(tokens / f"{split}.npy"), seq_len, max_tokens)
    agreeing = 0
    with torch.autocast("cuda", torch.bfloat16, enabled=device.startswith("cuda")):
        for start in range(0, len(batches), batch_size):
            inputs = batches[start : start + batch_size, :-1].to(device)
            same = draft_model(inputs).argmax(-1) == target_model(inputs).argmax(-1)
            agreeing += int(same.sum())
    count = batches[:, :-1].numel()
    return {"split": split, "top1_agreement": agreeing / count, "tokens": count}
