"""Tree verification on captured CUDA graphs, on the GPU (Triton, bf16, MXFP4 experts): a real
capture of tree graphs replays a tree step with the eager step's logits and aux states, and in the
engine every tree verification step (and every tree step of the draft model) replays a graph, with
greedy outputs that agree with plain decoding (bf16: but after a rare near tie). CPU twins:
test_tree_graphs.py."""

from __future__ import annotations

import pytest
import torch

from gossamer.runner.model_runner import EAGER_TREE, GRAPH, ModelRunner, SeqInput
from gossamer.spec.eagle3 import AuxHiddenRunner
from gossamer.spec.tree import TreeShape, ancestor_masks
from tests.spec.conftest import make_engine, repetitive_prompts, run_engine
from tests.spec.test_spec_gpu import (  # noqa: F401 (the paths fixture)
    paths,
    relative_error,
    requests,
    specs,
    triton_bf16,
)

pytestmark = pytest.mark.gpu

TREE = TreeShape.from_branching([3, 2, 1, 1])  # the tree of test_spec_gpu.specs: 21 nodes
Q = 1 + TREE.num_nodes


def _tree_graphs(runner):
    return [(key, graph) for key, graph in runner.graphs.items() if key[1] == Q]


def test_tree_graph_replay_returns_the_eager_logits_and_aux_states(paths):  # noqa: F811
    model = triton_bf16(paths)
    options = dict(
        aux_layers=(0, 1, 3), num_blocks=64, block_size=16, max_num_seqs=8,
        max_num_batched_tokens=256, graph_sizes=(1, 2, 4, 8),
    )  # fmt: skip
    graphed = AuxHiddenRunner(model, cuda_graphs=True, tree_query_len=Q, **options)
    eager = AuxHiddenRunner(model, cuda_graphs=False, **options)
    assert {(b, Q) for b in (1, 2, 4, 8)} <= set(graphed.graphs)
    prompts = [[t % 1000 for t in p[:20]] for p in repetitive_prompts(3, seed=5)]

    def table(i):
        groups = graphed.num_groups
        return tuple([1 + 8 * (groups * i + g) + b for b in range(8)] for g in range(groups))

    prefill = [SeqInput(p, 0, table(i)) for i, p in enumerate(prompts)]
    counts = [TREE.num_nodes, 5, 0]  # a full tree, a truncated one, a plain decode
    verify = []
    for i, (p, count) in enumerate(zip(prompts, counts, strict=True)):
        masks = ancestor_masks(TREE.parents[:count], with_root=True) if count else None
        tokens = [7 + i, *range(30, 30 + count)]
        verify.append(SeqInput(tokens, len(p), table(i), len(tokens), masks))
    for step in (prefill, verify):
        want, got = eager.run(step), graphed.run(step)
        assert got.shape == want.shape
        assert relative_error(got, want) < 5e-2
        assert relative_error(graphed.last_aux_hidden, eager.last_aux_hidden) < 5e-2
    # both steps replay the tree graphs: the 20-token prompts fit a tree graph's rows too
    assert graphed.step_modes[GRAPH] == 2 and graphed.step_modes[EAGER_TREE] == 0
    torch.cuda.synchronize()


@pytest.mark.parametrize("method", ["draft_tree", "eagle3_tree"])
def test_engine_tree_steps_replay_graphs(paths, method):  # noqa: F811
    model = triton_bf16(paths)
    plain, _, _ = run_engine(make_engine(model, None), requests())
    runner = None
    options = {"max_num_batched_tokens": 256, "max_num_seqs": 8}
    if method == "draft_tree":  # EngineCore does not pass tree_query_len (yet): build it here
        runner = ModelRunner(model, num_blocks=400, block_size=4, tree_query_len=Q, **options)
    engine = make_engine(model, specs(paths)[method], runner=runner, **options)
    assert engine.runner.tree_query_len == Q and _tree_graphs(engine.runner)
    tokens, _, _ = run_engine(engine, requests())
    stats = engine.stats.spec_stats
    modes = engine.runner.step_modes
    assert stats["num_tree_verify_steps"] > 0
    assert modes[EAGER_TREE] == 0, dict(modes)
    assert modes[GRAPH] >= stats["num_tree_verify_steps"]
    if method == "draft_tree":
        draft_runner = engine.speculator.proposers["draft"].runner
        assert draft_runner.step_modes[EAGER_TREE] == 0, dict(draft_runner.step_modes)
    agree = sum(tokens[key][:8] == plain[key][:8] for key in plain)
    assert agree >= len(plain) - 1  # the first tokens part only at a rare near tie
    torch.cuda.synchronize()
