"""Tree drafts in the engine: greedy outputs equal plain decoding token for token next to requests
that do not speculate, with chunked prefill (prefix hits and preemption: test_engine_spec.py and,
for EAGLE-3, test_eagle3.py), seeded sampling yields the very tokens of plain sampling, the stats
count nodes and depths, and the proposers' trees hold what they should."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from gossamer.engine.reference import ContiguousCache, forward_tokens
from gossamer.sampling_params import SamplingParams
from gossamer.spec.config import SpecConfig, SpecConfigError
from gossamer.spec.eagle3 import _HeadSequence
from gossamer.spec.proposer import Draft
from gossamer.spec.tree import TreeShape
from tests.spec.checkpoints import write_eagle3_checkpoint
from tests.spec.conftest import make_engine, repetitive_prompts, run_engine

GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
TREE = {"branching": [3, 2, 1]}  # 3 + 6 + 6 = 15 nodes, depth 3
TREE_SHAPE = TreeShape.from_branching(TREE["branching"])
AUX = (0, 1, 2)  # the EAGLE-3 heads read all three layers of target3


def workload(seed: int = 0) -> dict:
    """Greedy requests, a sampled one and two that never speculate (max_tokens 1 leaves no room
    for a draft; a short one speculates at most once)."""
    prompts = repetitive_prompts(6, seed)
    requests = {str(i): (p, GREEDY) for i, p in enumerate(prompts[:4])}
    requests["sampled"] = (prompts[4], SamplingParams(temperature=0.7, seed=5, max_tokens=16))
    requests["one"] = (prompts[5], SamplingParams(temperature=0, max_tokens=1))
    requests["short"] = (prompts[0][:5], SamplingParams(temperature=0, max_tokens=3))
    return requests


@pytest.fixture(scope="module")
def plain(target):
    return run_engine(make_engine(target, None), workload())[0]


def draft_tree(path, **options) -> SpecConfig:
    return SpecConfig(
        method="draft", model=str(path), num_speculative_tokens=3, tree=TREE, **options
    )


@pytest.mark.parametrize("draft", ["same", "other"])
def test_greedy_and_seeded_tree_speculation_equal_plain_decoding(
    draft, target, target_path, other_model_path, plain
):
    """Chunked prefill (a budget of 20 tokens) next to 16-token tree steps; the seeded request
    draws the tokens plain sampling draws (one race per emitted token)."""
    path = target_path if draft == "same" else other_model_path
    engine = make_engine(target, draft_tree(path), max_num_batched_tokens=20)
    tokens, _, _ = run_engine(engine, workload())
    assert tokens == plain
    stats = engine.stats.spec_stats
    assert stats["num_tree_drafts"] == stats["num_drafts"] > 0
    assert stats["num_tree_verify_steps"] > 0
    assert stats["num_draft_tokens"] > 2 * stats["num_draft_positions"]  # nodes vs depths
    assert engine.stats.generation_tokens == sum(len(t) for t in tokens.values())
    if draft == "same":
        assert stats["mean_accepted_length"] > 2.5


def test_logprobs_match_plain_decoding_with_trees(target, target_path):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    requests = {str(i): (p, params) for i, p in enumerate(repetitive_prompts(2, seed=12))}
    plain_tokens, plain_logprobs, _ = run_engine(make_engine(target, None), requests)
    engine = make_engine(target, draft_tree(target_path))
    tokens, logprobs, _ = run_engine(engine, requests)
    assert tokens == plain_tokens
    stats = engine.stats.spec_stats  # the target drafting for itself: every path to its end
    assert stats["num_accepted_tokens"] == stats["num_draft_positions"] > 0
    assert stats["acceptance_rate_pos_2"] == 1.0
    assert stats["acceptance_rate"] == stats["num_accepted_tokens"] / stats["num_draft_tokens"]
    assert stats["num_padding_tokens"] == 0  # no graph holds a tree mask: nothing to pad for
    for key, values in logprobs.items():
        for got, want in zip(values, plain_logprobs[key], strict=True):
            assert got.token_id == want.token_id
            assert got.logprob == pytest.approx(want.logprob, abs=1e-4)


def test_a_tree_larger_than_the_token_budget_is_refused(target, target_path):
    with pytest.raises(SpecConfigError, match="max_num_batched_tokens"):
        make_engine(target, draft_tree(target_path), max_num_batched_tokens=12)


def first_branch(draft: Draft) -> list[int]:
    """The tokens of a tree draft's rank-0 path: the greedy chain it contains."""
    tokens, node = [], -1
    while True:
        child = next(
            (i for i, p in enumerate(draft.parents) if p == node and TREE_SHAPE.ranks[i] == 0),
            None,
        )
        if child is None:
            return tokens
        tokens.append(draft.token_ids[child])
        node = child


def proposals(engine, requests) -> dict[str, Draft]:
    """The drafts the engine's speculator holds for the next step, after one step."""
    for request_id, (prompt, params) in requests.items():
        engine.add_request(request_id, prompt, params)
    engine.step()
    return {request_id: entry[1] for request_id, entry in engine.speculator._pending.items()}


def test_a_draft_models_tree_holds_the_top_k_after_every_path(target3, target3_path):
    """Node i is the ranks[i]-th most likely token after the request's tokens and the path to
    its parent, by plain decoding of that path (the draft model is the target here)."""
    requests = {str(i): (p, GREEDY) for i, p in enumerate(repetitive_prompts(3, seed=2))}
    spec = SpecConfig(method="draft", model=str(target3_path), num_speculative_tokens=3, tree=TREE)
    engine = make_engine(target3, spec)
    trees = proposals(engine, requests)
    assert set(trees) == set(requests)
    for request_id, draft in trees.items():
        known = engine.scheduler.get_request(request_id).all_token_ids
        for node, parent in enumerate(draft.parents):
            context = known + [draft.token_ids[i] for i in _path(draft.parents, parent)]
            logits = forward_tokens(target3, ContiguousCache(target3, len(context)), context, 0)
            rank = TREE_SHAPE.ranks[node]
            assert draft.token_ids[node] == int(logits[-1].topk(rank + 1).indices[rank])


def _path(parents: list[int], node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def test_the_first_branch_of_an_eagle3_tree_is_its_greedy_chain(target3, tmp_path):
    """The rank-0 path is computed like a chain (each node at its depth's position, attending
    to its ancestors only, with its parent's pre-norm state): the same tokens."""
    model = str(
        write_eagle3_checkpoint(
            tmp_path / "head", vocab_size=320, target_hidden_size=64, aux_layer_ids=AUX
        )
    )
    requests = {str(i): (p, GREEDY) for i, p in enumerate(repetitive_prompts(3, seed=2))}
    chain = SpecConfig(method="eagle3", model=model, num_speculative_tokens=3, pad_drafts=False)
    chains = proposals(make_engine(target3, chain), requests)
    trees = proposals(make_engine(target3, replace(chain, tree=TREE)), requests)
    assert set(chains) == set(trees) == set(requests)
    for request_id, draft in trees.items():
        assert len(draft.token_ids) == 15 and draft.parents == list(TREE_SHAPE.parents)
        assert first_branch(draft) == chains[request_id].token_ids


def test_eagle3_reads_the_hidden_states_of_the_accepted_nodes(target3, tmp_path):
    """After a tree step the head's input at accepted token j + 1 is the target's hidden state
    of the step's row 1 + path[j] (where node path[j] was fed), not row j + 1."""
    path = write_eagle3_checkpoint(
        tmp_path / "head", vocab_size=320, target_hidden_size=64, aux_layer_ids=AUX
    )
    spec = SpecConfig(method="eagle3", model=str(path), num_speculative_tokens=3, tree=TREE)
    proposer = make_engine(target3, spec).speculator.proposers["eagle3"]
    sequence = proposer._sequences["r"] = _HeadSequence("r")
    assert proposer.manager.allocate_slots(sequence, 9)
    sequence.num_computed_tokens = 9  # the head computed positions 0..8 before the step
    aux = torch.arange(20 * 3 * 64, dtype=torch.float32).view(20, 3 * 64)
    tokens = list(range(12))  # 10 known before the step, which emitted 2 (1 accepted + 1)
    # the step fed the root (position 9) and 15 nodes as the request's rows 4..19; node 2 won
    feed = proposer._feed("r", 9, (4, 20), tokens, aux, path=[2])
    torch.testing.assert_close(feed.hidden, aux[[4, 4 + 1 + 2]])
    assert feed.start == 9 and feed.token_ids == tokens[10:12] and feed.ready
