"""Tree verification through captured graphs, tested on the CPU: EagerGraphCapture stands in for CUDA
graphs (a "replay" runs the captured step function again on the same persistent buffers), so the
tree graph path runs as on the GPU: the plan, each sequence padded to the graph's tokens, the tree
mask and depth positions read from the device buffers, the wanted rows gathered back. The GPU twins
that capture for real are in test_spec_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gossamer.runner.model_runner import (
    EAGER_TREE,
    GRAPH,
    EagerGraphCapture,
    ModelRunner,
    SeqInput,
)
from gossamer.sampling_params import SamplingParams
from gossamer.spec.config import SpecConfig
from gossamer.spec.draft_model import DraftModelProposer
from gossamer.spec.tree import TreeShape, ancestor_masks
from tests.spec.checkpoints import write_eagle3_checkpoint
from tests.spec.conftest import (
    AUX,
    assert_runs_alike,
    aux_runner,
    make_engine,
    repetitive_prompts,
    run_engine,
    tables,
)

SIZES = [1, 2, 4]
TREE = TreeShape.from_branching([2, 2, 1])  # 2 + 4 + 4 = 10 nodes
Q = 1 + TREE.num_nodes  # a verification step's tokens per sequence
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def verify_step(runner, prompts, num_nodes) -> list[SeqInput]:
    """Per prompt: the pending token and the first num_nodes[i] nodes of TREE (0: a decode)."""
    seqs = []
    for i, (prompt, count) in enumerate(zip(prompts, num_nodes, strict=True)):
        tokens = [7 + i] + [(11 * i + node) % 300 for node in range(count)]
        masks = ancestor_masks(TREE.parents[:count], with_root=True) if count else None
        seqs.append(SeqInput(tokens, len(prompt), tables(runner, i), len(tokens), masks))
    return seqs


@pytest.fixture
def runners(target3):
    eager = aux_runner(target3, cuda_graphs=False)
    graphed = aux_runner(target3, cuda_graphs=False, tree_query_len=Q)
    graphed.capture_graphs(SIZES, (1, Q), capture=EagerGraphCapture())
    return eager, graphed


def test_tree_steps_replay_the_tree_graph_with_the_eager_results(runners):
    eager, graphed = runners
    assert {(b, Q) for b in SIZES} <= set(graphed.graphs)
    prompts = repetitive_prompts(3, seed=8)
    steps = [
        [SeqInput(p, 0, tables(eager, i)) for i, p in enumerate(prompts)],  # prefill: eager
        verify_step(eager, prompts, [TREE.num_nodes] * 3),  # full trees: (4, Q), one padding seq
        # a truncated tree beside a plain decode and a full tree (positions after the last step's
        # root: the rejected nodes' KV is overwritten, as after a rollback)
        verify_step(eager, [p + [0] for p in prompts], [3, 0, TREE.num_nodes]),
    ]
    for step in steps:
        # aux rows packed in sequence order; padding tokens and padding sequences wrote no KV
        assert_runs_alike(eager, graphed, step)
    assert graphed.graphs[(4, Q)].num_replays == 2
    assert graphed.step_modes[GRAPH] == 2 and eager.step_modes[GRAPH] == 0
    assert eager.step_modes[EAGER_TREE] == 0  # no graphs at all: EAGER_NO_GRAPHS


def test_draft_model_tree_growth_steps_gather_their_wanted_logits(runners):
    """The draft model grows a tree by feeding its nodes (no root) and wanting the logits of the
    deepest level only; catch-up steps feed a few true tokens and want the last logits."""
    eager, graphed = runners
    prompts = repetitive_prompts(2, seed=9)
    for runner in runners:
        runner.run([SeqInput(p, 0, tables(runner, i)) for i, p in enumerate(prompts)])
    count = TREE.num_nodes_within(2)  # depths 1 and 2
    masks = ancestor_masks(TREE.parents[:count], with_root=False)
    wanted = len(TREE.level(2, count))
    grow = [
        SeqInput(list(range(5, 5 + count)), len(prompts[0]), tables(eager, 0), wanted, masks),
        SeqInput([3, 4, 9], len(prompts[1]), tables(eager, 1), 1),  # catch-up: last logits only
    ]
    want = eager.run(grow)
    got = graphed.run(grow)
    assert got.shape == (wanted + 1, want.shape[1])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert graphed.step_modes[GRAPH] == 1


def test_steps_no_tree_graph_holds_run_eagerly(runners, target3):
    _, graphed = runners
    prompts = repetitive_prompts(4, seed=10)
    too_many = verify_step(graphed, prompts, [TREE.num_nodes] * 4)
    too_many.append(SeqInput([1], 3, tables(graphed, 4)))  # 5 sequences: no graph of 5
    assert graphed.plan(too_many) == (None, EAGER_TREE)
    near_the_end = verify_step(graphed, [[0] * (target3.max_model_len - 3)], [2])
    assert graphed.plan(near_the_end) == (None, EAGER_TREE)  # no room for the padding
    assert graphed.plan(verify_step(graphed, prompts[:2], [2, 5])) == ((2, Q), GRAPH)


def test_tree_padding_in_the_host_buffers(runners):
    """A truncated tree's padding: no slots, own-bit masks at depth 0, null-block table entries
    past the sequence's own; a padding sequence: causal, the null block."""
    _, graphed = runners
    seqs = [
        SeqInput([7, 8, 9], 5, ([3, 4],), 3, ancestor_masks([-1, -1], with_root=True)),
        SeqInput([6], 9, ([5, 6, 2],), 1),
    ]
    graphed.num_groups = 1  # one table per sequence in this check
    logit_rows, token_rows = graphed._fill_tree_graph(seqs, 4, Q)
    graphed._pad(2, 4, Q)
    host = graphed.host
    assert token_rows == [0, 1, 2, Q] and logit_rows == [0, 1, 2, Q]
    assert host["tree_mask"][:4].tolist() == [1, 3, 5, 1 << 3]
    assert host["positions"][:4].tolist() == [5, 6, 6, 5]
    assert (host["slot_mapping"][0, 3:Q] == -1).all()
    assert host["seq_lens"][:2].tolist() == [5 + Q, 9 + Q]
    assert host["query_start_loc"][:5].tolist() == [0, Q, 2 * Q, 3 * Q, 4 * Q]
    # the causal decode's padding sits after it; its tree mask stays 0
    assert host["positions"][Q : Q + 3].tolist() == [9, 10, 11] and not host["tree_mask"][Q:].any()
    width = -(-(5 + Q) // 4)
    assert host["block_tables"][0, 0, :width].tolist() == [3, 4] + [0] * (width - 2)
    assert (host["block_tables"][0, 2:4, : -(-Q // 4)] == 0).all()
    assert graphed._width >= -(-(9 + Q) // 4)
    assert np.array_equal(host["slot_mapping"][0, 2 * Q : 4 * Q], np.full(2 * Q, -1))


# ---- the engine, with graphs captured through EagerGraphCapture ---------------------------------


@pytest.fixture
def cpu_graphs(monkeypatch):
    """Every ModelRunner built from here on captures its graphs (q = 1 and its tree graphs)
    through EagerGraphCapture; returns the runners built, in order."""
    built = []
    original = ModelRunner.__init__

    def capture_on_cpu(self, *args, **kwargs):
        original(self, *args, **kwargs)
        lens = (1,) if self.tree_query_len is None else (1, self.tree_query_len)
        self.capture_graphs(SIZES, lens, capture=EagerGraphCapture())
        built.append(self)

    monkeypatch.setattr(ModelRunner, "__init__", capture_on_cpu)
    return built


def tree_replays(runner) -> int:
    return sum(runner.graphs[(b, Q)].num_replays for b in SIZES if (b, Q) in runner.graphs)


@pytest.mark.parametrize("method", ["draft", "eagle3"])
def test_engine_tree_steps_replay_graphs_and_equal_plain_decoding(
    method, target3, target3_path, tmp_path, cpu_graphs
):
    """Greedy draft-tree and EAGLE-3-tree speculation on tree graphs give plain decoding's
    tokens; every target verification step (and every tree step of the draft model) replays a
    graph. EAGLE-3's target runner gets its tree graphs from the proposer's runner factory; the
    draft method's target runner is passed in here (see the report: EngineCore should pass
    tree_query_len itself)."""
    prompts = repetitive_prompts(3, seed=11)
    requests = {str(i): (p, GREEDY) for i, p in enumerate(prompts)}
    plain, _, _ = run_engine(make_engine(target3, None, max_num_seqs=4), requests)
    model = str(target3_path)
    if method == "eagle3":
        model = str(
            write_eagle3_checkpoint(
                tmp_path, vocab_size=320, target_hidden_size=64, aux_layer_ids=AUX, seed=3
            )
        )
    config = SpecConfig(
        method=method, model=model, num_speculative_tokens=3, tree={"branching": [2, 2, 1]}
    )
    options = {"max_num_seqs": 4, "max_num_batched_tokens": 64}
    runner = None
    if method == "draft":
        runner = ModelRunner(
            target3, num_blocks=400, block_size=4, tree_query_len=Q, **_runner_options(options)
        )
    engine = make_engine(target3, config, runner=runner, **options)
    tokens, _, _ = run_engine(engine, requests)
    assert tokens == plain
    stats = engine.stats.spec_stats
    assert engine.runner.tree_query_len == Q
    assert tree_replays(engine.runner) >= stats["num_tree_verify_steps"] > 0
    assert engine.runner.step_modes[EAGER_TREE] == 0
    if method == "draft":
        proposer = engine.speculator.proposers["draft"]
        assert isinstance(proposer, DraftModelProposer)
        assert tree_replays(proposer.runner) > 0
        assert proposer.runner.step_modes[EAGER_TREE] == 0


def _runner_options(options: dict) -> dict:
    return {
        "max_num_seqs": options["max_num_seqs"],
        "max_num_batched_tokens": options["max_num_batched_tokens"],
        "cuda_graphs": False,
        "warmup": False,
    }
