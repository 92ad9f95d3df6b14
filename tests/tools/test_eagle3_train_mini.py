"""The EAGLE-3 trainer for gpt-oss-mini, end to end on the CPU with tiny settings: it learns, its
checkpoint loads through the engine's proposer and computes what the trainer computed, and greedy
decoding with it equals plain decoding."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from gossamer.model.loader import load_model
from gossamer.models import default_model_path
from gossamer.spec.eagle3 import load_eagle3_head, paged_metadata
from tools.eagle3.head import DraftHead
from tools.eagle3.train_mini import main

STEPS = 10


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle3_mini")
    args = ["--tiny", "--device", "cpu", "--out", str(root / "out"), "--work", str(root / "work")]
    summary = main([*args, "--max-files", "8", "--steps", str(STEPS), "--seq-len", "48"])
    return summary, root / "out"


@pytest.fixture(scope="module")
def target():
    return load_model(str(default_model_path()), dtype="float32", max_model_len=256).model


def test_training_lowers_the_loss_on_train_and_held_out_windows(run):
    summary, out = run
    assert json.loads((out / "summary.json").read_text())["training"]["steps"] == STEPS
    first, last = summary["training"]["first"], summary["training"]["last"]
    assert last["step"] == STEPS
    assert last["step_losses"][0] < first["step_losses"][0]
    before = summary["val_teacher_forced"]["before"]["step_losses"]
    after = summary["val_teacher_forced"]["after"]["step_losses"]
    assert all(a < b for a, b in zip(after, before, strict=True))


def test_checkpoint_has_the_published_layout(run, target):
    summary, out = run
    folder = out / "head"
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    tensors = load_file(folder / "model.safetensors")
    draft_ids = tensors["d2t"] + torch.arange(config["draft_vocab_size"])
    assert draft_ids.tolist() == sorted(set(draft_ids.tolist()))  # distinct, ascending
    assert torch.equal(tensors["t2d"].nonzero()[:, 0], draft_ids)
    assert tensors["fc.weight"].shape == (target.config.hidden_size, 3 * target.config.hidden_size)
    assert "embed_tokens.weight" not in tensors  # the engine shares the target's
    assert summary["draft_vocab"]["size"] == config["draft_vocab_size"] < target.config.vocab_size


def test_engine_head_computes_what_the_trainer_unrolled(run, target):
    """The engine's head (paged cache) drafts three steps from position P; the trainer's twin
    unrolls three steps over every position: row P of each step must agree."""
    _, out = run
    folder = out / "head"
    engine_head = load_eagle3_head(folder, target)
    twin = DraftHead.load(folder, target.model.embed_tokens.weight, target.max_model_len)
    gen = torch.Generator().manual_seed(0)
    token_ids = torch.randint(0, target.config.vocab_size, (20,), generator=gen)
    aux = torch.randn(20, 3 * target.config.hidden_size, generator=gen)
    with torch.no_grad():
        unrolled = twin.unroll(token_ids[None], aux[None], steps=3)
    start = 11  # P: the chain's first position
    kv_cache = engine_head.allocate_kv_cache(8, 4)
    table = [5, 2, 7, 1, 3, 6]
    with torch.inference_mode():
        meta = paged_metadata([(0, start + 1, table)], 4, kv_cache.device)
        normed, prenorm = engine_head(
            token_ids[1 : start + 2], torch.arange(start + 1), aux[: start + 1], meta, kv_cache
        )
        normed, prenorm = normed[-1:], prenorm[-1:]
        for step in range(3):
            logits = normed @ engine_head.lm_head.weight.T
            torch.testing.assert_close(logits[0], unrolled[step][0, start], rtol=1e-4, atol=1e-4)
            position = start + 1 + step
            meta = paged_metadata([(position, 1, table)], 4, kv_cache.device)
            normed, prenorm = engine_head(
                token_ids[position + 1 : position + 2],
                torch.tensor([position]),
                prenorm,
                meta,
                kv_cache,
                from_target=False,
            )


def test_greedy_outputs_with_the_trained_head_equal_plain_decoding(run):
    summary, _ = run
    engine = summary["engine_heldout"]
    assert engine["num_drafts"] > 0
    assert engine["generated_tokens"] > 0
    comparison = engine["outputs_vs_plain"]
    assert comparison["identical"] == comparison["total"] == engine["prompts"]
    exact = summary["exact_float32"]
    assert exact["identical"] == exact["total"] > 0
