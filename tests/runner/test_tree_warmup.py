"""The warm-up of a tree-speculation runner (tree_query_len) also reaches every TREE attention
launch that eager tree steps take later: trees of any size up to the runner's, truncated ones, at
any context, in batches and beside prompt chunks. Same recorders as test_warmup.py (no GPU)."""

from __future__ import annotations

import numpy as np
import pytest

from gossamer.runner.model_runner import SeqInput
from gossamer.runner.warmup import tree_warmup_plan, warm_up
from gossamer.spec.tree import TreeShape, ancestor_masks
from tests.runner.test_warmup import (  # noqa: F401 (the model fixture)
    BUDGET,
    CONTEXTS,
    MAX_MODEL_LEN,
    describe,
    make_runner,
    model,
    recording,
    table,
)

TREE = TreeShape.from_branching([3, 2, 1])  # 15 nodes: 16 tokens, the prefill launch
TREE_QUERY_LEN = 1 + TREE.num_nodes


def tree_seq(num_nodes: int, context: int) -> SeqInput:
    """A verification step of the tree's first num_nodes nodes, `context` tokens after it."""
    masks = ancestor_masks(TREE.parents[:num_nodes], with_root=True)
    query_len = 1 + num_nodes
    return SeqInput([5] * query_len, context - query_len, table(context), query_len, masks)


def tree_serving_steps() -> list[list[SeqInput]]:
    rng = np.random.default_rng(1)
    steps = [[tree_seq(n, c)] for n in range(1, TREE.num_nodes + 1) for c in (n + 1, *CONTEXTS)]
    for num_seqs in (2, 5, 8):
        nodes = rng.integers(1, TREE.num_nodes + 1, num_seqs).tolist()
        contexts = rng.choice(CONTEXTS, num_seqs).tolist()
        steps.append([tree_seq(n, c) for n, c in zip(nodes, contexts, strict=True)])
    prompt = SeqInput([5] * 40, 0, table(40), 1)
    steps.append([tree_seq(3, 300), prompt])  # a small tree beside a prompt chunk
    steps.append([tree_seq(TREE.num_nodes, 4000), prompt])
    return steps


@pytest.fixture(scope="module")
def recorded(model):  # noqa: F811 (the imported fixture)
    runner = make_runner(model, tree_query_len=TREE_QUERY_LEN)
    with recording(model) as log:
        warm_up(runner, progress=False)
        warm = set(log)
        log.clear()
        for step in tree_serving_steps():
            runner.run(step)
        serving = set(log)
    return warm, serving


def test_every_later_tree_launch_was_compiled_by_the_warm_up(recorded):
    warm, serving = recorded
    assert any(dict(launch.constexprs).get("TREE") for launch in serving)
    missing = serving - warm
    assert not missing, f"tree launches the warm-up missed:\n{describe(missing)}"


def test_the_tree_plan_covers_each_block_q_and_the_prefill_launch():
    steps = tree_warmup_plan(MAX_MODEL_LEN, BUDGET, TREE_QUERY_LEN)
    assert all(step.tree and step.all_logits for step in steps)
    assert sorted({step.query_lens[0] for step in steps}) == [2, 4, 8, 9]
    small = tree_warmup_plan(MAX_MODEL_LEN, BUDGET, 3)  # a 2-node tree: BLOCK_Q 2 and 4 (q = 3)
    assert sorted({step.query_lens[0] for step in small}) == [2, 3, 9]
