"""Decode graphs per context bucket (model_runner.CONTEXT_GRAPHS): attention's bounds, and the
runner's capture and choice of graph, checked on the CPU (EagerGraphCapture stands in for CUDA
graphs; the torch attention runs alike at any bound, so the logits must not change at all)."""

from __future__ import annotations

import pytest
import torch

from gossamer.kernels import attention
from gossamer.model.loader import load_model
from gossamer.runner import model_runner
from gossamer.runner.model_runner import EagerGraphCapture, ModelRunner, SeqInput
from tests.hf_models import write_hf_model

H200_SMS = 132
CPU = torch.device("cpu")


def splits(num_seqs: int, context: int) -> int:
    """The key splits of a one-token decode launch over `context` keys (8 kv heads)."""
    min_chunk = attention.DECODE_MIN_SPLIT_KEYS
    return attention._decode_splits(num_seqs, 8, context, min_chunk, CPU)


@pytest.mark.parametrize(
    ("num_seqs", "max_len"), [(1, 131072), (2, 131072), (4, 8192), (1, 3000), (20, 8192)]
)
def test_each_context_gets_the_splits_of_an_uncaptured_step(monkeypatch, num_seqs, max_len):
    """A graph captured at the first bound that holds a context launches what an uncaptured step
    of that context would; past the last bound, the max_len graph does."""
    monkeypatch.setattr(attention, "_sm_count", lambda device: H200_SMS)
    bounds = attention.decode_context_bounds(num_seqs, 1, 8, max_len, CPU)
    assert attention.decode_context_bounds(num_seqs, 4, 8, max_len, CPU) == bounds  # verification
    assert bounds == sorted(set(bounds)) and all(bound < max_len for bound in bounds)
    for context in range(1, max_len + 1, 7):
        captured_at = next((bound for bound in bounds if context <= bound), max_len)
        assert splits(num_seqs, captured_at) == splits(num_seqs, context), context


def test_bounds_at_batch_1_on_an_h200(monkeypatch):
    """At batch 1 a 131k graph launches 64 splits; 1k keys need 16 (a spot check of the rule)."""
    monkeypatch.setattr(attention, "_sm_count", lambda device: H200_SMS)
    bounds = attention.decode_context_bounds(1, 1, 8, 131072, CPU)
    assert splits(1, 131072) == 64 and splits(1, 1024) == 16
    assert [splits(1, bound) for bound in bounds] == [1, 2, 4, 8, 16, 32]
    assert attention.decode_context_bounds(8, 1, 8, 131072, CPU)[-1] < 512  # 8 splits from 512 on
    # batch 64: 512 programs already, about 4 an SM: one split (two measured slower)
    assert splits(64, 1024) == 1 and splits(32, 1024) == 2
    past_decode = attention.DECODE_MAX_QUERY_LEN + 1  # (the prefill launch: one split)
    assert attention.decode_context_bounds(1, past_decode, 8, 131072, CPU) == []


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_hf_model(tmp_path_factory.mktemp("context_graphs"), seed=29, num_hidden_layers=2)
    return load_model(str(path), dtype="float32").model


def runner_for(model, monkeypatch, context_graphs: bool, tree_query_len=None) -> ModelRunner:
    monkeypatch.setattr(model_runner, "CONTEXT_GRAPHS", context_graphs)
    monkeypatch.setattr(model_runner, "CONTEXT_GRAPH_MIN_LEN", 10)
    # bounds as attention gives them, the shortest below the runner's minimum
    monkeypatch.setattr(
        model.ops, "decode_context_bounds", lambda *args: [6, 12, 20], raising=False
    )
    runner = ModelRunner(
        model,
        num_blocks=64,
        block_size=4,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        tree_query_len=tree_query_len,
    )
    runner.capture_graphs([1, 2, 4], (1, 3), capture=EagerGraphCapture())
    return runner


TABLES = [(list(range(1 + 8 * i, 9 + 8 * i)),) * 2 for i in range(2)]


def prefill(runner: ModelRunner) -> tuple[list[list[int]], torch.Tensor]:
    """Two prompts (9 and 5 tokens): their tokens and last logits."""
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 320, (n,), generator=gen).tolist() for n in (9, 5)]
    return prompts, runner.run([SeqInput(p, 0, t) for p, t in zip(prompts, TABLES, strict=True)])


def decode(runner: ModelRunner, steps: int) -> list[torch.Tensor]:
    """`prefill`, then `steps` greedy decode steps of both: their logits."""
    prompts, logits = prefill(runner)
    tables = TABLES
    outputs = []
    texts = [list(p) for p in prompts]
    for _ in range(steps):
        for text, row in zip(texts, logits, strict=True):
            text.append(int(row.argmax()))
        seqs = [
            SeqInput([t[-1]], len(t) - 1, table) for t, table in zip(texts, tables, strict=True)
        ]
        logits = runner.run(seqs).clone()
        outputs.append(logits)
    return outputs


def test_steps_replay_the_first_bucket_that_holds_them(model, monkeypatch):
    runner = runner_for(model, monkeypatch, context_graphs=True)
    buckets = runner.context_graphs
    assert set(buckets) == {(1, 1), (2, 1), (4, 1), (1, 3), (2, 3)}  # up to 8 tokens
    for entries in buckets.values():
        assert [bound for bound, *_ in entries] == [12, 20]
        for bound, graph, *_ in entries:
            assert graph.step.args[2].max_seq_len == bound  # attention's metadata, captured
    assert runner.graphs[(2, 1)].step.args[2].max_seq_len == model.max_model_len
    # the longer prompt is at 10 tokens in the first step: 3 steps in the 12 bucket (10..12), 8 in
    # the 20 bucket (13..20), then the max_model_len graph
    outputs = decode(runner, 14)
    replays = [graph.num_replays for _, graph, *_ in buckets[(2, 1)]]
    assert replays == [3, 8] and runner.graphs[(2, 1)].num_replays == 14 - 11
    plain = runner_for(model, monkeypatch, context_graphs=False)
    assert plain.context_graphs == {}
    for bucketed, reference in zip(outputs, decode(plain, 14), strict=True):
        torch.testing.assert_close(bucketed, reference, rtol=0, atol=0)


@pytest.mark.parametrize("tree_query_len", [None, 3])
def test_verification_steps_replay_buckets_too(model, monkeypatch, tree_query_len):
    """Steps of 3 tokens a sequence (speculative verification, through a tree graph when its length
    is the tree graphs'): the longer sequence ends at 12 tokens, in the first bucket."""
    runner = runner_for(model, monkeypatch, True, tree_query_len)
    plain = runner_for(model, monkeypatch, False, tree_query_len)
    results = []
    for each in (runner, plain):
        prompts, _ = prefill(each)
        drafts = [[7, 8, 9], [10, 11, 12]]
        seqs = [SeqInput(d, len(p), t, 3) for d, p, t in zip(drafts, prompts, TABLES, strict=True)]
        results.append(each.run(seqs).clone())
    first_bucket = runner.context_graphs[(2, 3)][0]
    assert first_bucket[0] == 12 and first_bucket[1].num_replays == 1
    assert runner.graphs[(2, 3)].num_replays == 0
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)
