"""Tree drafts, the parts below the engine: tree shapes and their config, ancestor masks, the tree
attention mask of the torch op against a brute-force loop, a whole tree step of the model against
plain decoding of every root-to-node path, and the KV moves that leave the accepted path where a
chain would have put it."""

from __future__ import annotations

import math

import pytest
import torch

from gossamer.engine.reference import ContiguousCache, forward_tokens
from gossamer.ops.base import AttentionMetadata
from gossamer.ops.torch_ref import TorchOps
from gossamer.runner.model_runner import ModelRunner, SeqInput
from gossamer.spec.config import SpecConfigError, parse_spec_config
from gossamer.spec.tree import (
    TreeShape,
    ancestor_masks,
    chain_moves,
    move_accepted_kv,
    tree_depth,
)

# ---- shapes --------------------------------------------------------------------------------------


def test_branching_and_paths_build_breadth_first_trees():
    tree = TreeShape.from_branching([3, 2, 1])
    assert tree.num_nodes == 3 + 6 + 6 and tree.max_depth == 3
    assert tree.parents[:9] == (-1, -1, -1, 0, 0, 1, 1, 2, 2)
    assert tree.ranks[:9] == (0, 1, 2, 0, 1, 0, 1, 0, 1)
    assert tree.parents[9:] == tuple(range(3, 9))
    assert list(tree.level(2, tree.num_nodes)) == list(range(3, 9))
    assert list(tree.level(3, 11)) == [9, 10]
    assert tree.num_nodes_within(1) == 3
    # the same tree as rank paths, listed in any order
    paths = [[0], [1], [2]] + [[a, b] for a in range(3) for b in range(2)]
    paths += [[a, b, 0] for a in range(3) for b in range(2)]
    assert TreeShape.from_paths(list(reversed(paths))) == tree
    eagle_like = TreeShape.from_paths([[0], [1], [0, 0], [1, 0], [0, 1], [0, 0, 0]])
    assert eagle_like.parents == (-1, -1, 0, 0, 1, 2)
    assert eagle_like.ranks == (0, 1, 0, 1, 0, 0)


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        ({"branching": []}, "branching"),
        ({"branching": [2, 0]}, "branching"),
        ({"branching": [8, 8]}, "more than 62 nodes"),
        ({"paths": [[0], [0, 1, 0]]}, "needs its prefix"),
        ({"paths": [[0], [0]]}, "distinct"),
        ({"paths": [[-1]]}, "ranks"),
        ({"depth": 3}, "branching"),
        ({"branching": [2, 1, 1, 1, 1]}, "num_speculative_tokens to at least"),
    ],
)
def test_bad_trees_are_refused_with_what_is_wrong(tree, message):
    with pytest.raises(SpecConfigError, match=message):
        parse_spec_config({"method": "draft", "model": "m", "tree": tree})


def test_trees_need_a_model_method_and_no_cost_model():
    tree = {"branching": [2]}
    with pytest.raises(SpecConfigError, match="draft or eagle3"):
        parse_spec_config({"method": "ngram", "tree": tree})
    with pytest.raises(SpecConfigError, match="cost_aware"):
        parse_spec_config({"method": "draft", "model": "m", "tree": tree, "cost_aware": True})
    config = parse_spec_config(
        '{"method": "eagle3", "model": "m", "tree": {"branching": [3, 2, 1, 1]}}'
    )
    assert config.tree == TreeShape.from_branching([3, 2, 1, 1])
    assert parse_spec_config({"method": "draft", "model": "m"}).tree is None


def test_ancestor_masks_hold_each_node_and_its_ancestors():
    parents = (-1, -1, 0, 0, 2)  # node 4 <- 2 <- 0 <- root
    with_root = ancestor_masks(parents, with_root=True)
    assert with_root == (0b1, 0b11, 0b101, 0b1011, 0b10011, 0b101011)
    nodes_only = ancestor_masks(parents, with_root=False)
    assert nodes_only == (0b1, 0b10, 0b101, 0b1001, 0b10101)
    assert [m.bit_count() - 1 for m in with_root] == [0, 1, 1, 2, 2, 3]
    assert tree_depth(parents) == 3 and tree_depth(()) == 0


def test_chain_moves_never_read_a_slot_already_written():
    assert chain_moves([0, 2, 4]) == [(3, 2), (5, 3)]
    assert chain_moves([1]) == [(2, 1)]
    assert chain_moves([0, 1]) == []


# ---- the attention op ------------------------------------------------------------------------------


def brute_force_attention(q, kv_cache, table, seq_len, masks, sinks, scale, window):
    """One query token and one head at a time: the visible keys listed by hand."""
    q_len, num_heads, dim = q.shape
    block_size, num_kv_heads = kv_cache.shape[2], kv_cache.shape[3]
    first = seq_len - q_len
    out = torch.zeros(q_len, num_heads, dim)
    for i in range(q_len):
        depth = masks[i].bit_count() - 1
        position = first + depth
        keys = [(p, p) for p in range(first)]  # (slot position, position)
        for j in range(q_len):
            if masks[i] >> j & 1:
                keys.append((first + j, first + masks[j].bit_count() - 1))
        if window is not None:
            keys = [(slot, p) for slot, p in keys if position - p < window]
        for head in range(num_heads):
            kv_head = head // (num_heads // num_kv_heads)
            logits, values = [float(sinks[head])], []
            for slot, _ in keys:
                block = int(table[slot // block_size])
                key = kv_cache[0, block, slot % block_size, kv_head]
                values.append(kv_cache[1, block, slot % block_size, kv_head])
                logits.append(float(q[i, head] @ key) * scale)
            weights = torch.softmax(torch.tensor(logits), dim=0)[1:]
            out[i, head] = sum(w * v for w, v in zip(weights, values, strict=True))
    return out


@pytest.mark.parametrize("window", [None, 3])
def test_tree_attention_matches_a_brute_force_loop(window):
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, block_size = 4, 2, 8, 4
    kv_cache = torch.randn(2, 16, block_size, kv_heads, dim, generator=gen)
    table = torch.tensor([5, 2, 9, 7, 11, 3], dtype=torch.int32)
    prefix = 6
    parents = (-1, -1, 0, 0, 1, 2, 4, 6)  # depth 5 at node 7: past a window of 3
    masks = ancestor_masks(parents, with_root=True)
    q_len = len(masks)
    seq_len = prefix + q_len
    # a causal sequence in the same step
    other_table = torch.tensor([1, 4, 6, 8, 10, 12], dtype=torch.int32)
    other_len, other_q = 9, 3
    q = torch.randn(q_len + other_q, heads, dim, generator=gen)
    sinks = torch.randn(heads, generator=gen)
    width = len(table)
    metadata = AttentionMetadata(
        query_start_loc=torch.tensor([0, q_len, q_len + other_q], dtype=torch.int32),
        seq_lens=torch.tensor([seq_len, other_len], dtype=torch.int32),
        slot_mapping=(torch.zeros(q_len + other_q, dtype=torch.long),),
        block_tables=(torch.stack([table, other_table[:width]]),),
        max_query_len=q_len,
        max_seq_len=seq_len,
        tree_mask=torch.tensor([*masks, 0, 0, 0]),
    )
    scale = 1 / math.sqrt(dim)
    out = TorchOps().attention(q, kv_cache, metadata, 0, sinks, scale, window)
    want = brute_force_attention(q[:q_len], kv_cache, table, seq_len, masks, sinks, scale, window)
    torch.testing.assert_close(out[:q_len], want, rtol=1e-5, atol=1e-5)
    causal = [(1 << (j + 1)) - 1 for j in range(other_q)]  # the causal rule as a mask
    want_other = brute_force_attention(
        q[q_len:], kv_cache, other_table, other_len, causal, sinks, scale, window
    )
    torch.testing.assert_close(out[q_len:], want_other, rtol=1e-5, atol=1e-5)


# ---- a whole tree step of the model ----------------------------------------------------------------


def test_a_tree_step_scores_every_node_as_plain_decoding_of_its_path(target):
    """Every node's logits equal those of feeding its root-to-node path causally (sliding layers
    included: the prefix is longer than the window), next to a prompt chunk of another request;
    after `move_accepted_kv` the accepted path's KV sits where a chain step would have put it."""
    gen = torch.Generator().manual_seed(3)
    runner = ModelRunner(
        target, num_blocks=40, block_size=4, max_num_seqs=4, max_num_batched_tokens=64,
        cuda_graphs=False,
    )  # fmt: skip
    groups = target.num_cache_groups
    tables = tuple(list(range(1 + 10 * g, 11 + 10 * g)) for g in range(groups))
    other_tables = tuple(list(range(21 + 5 * g, 26 + 5 * g)) for g in range(groups))
    prompt = torch.randint(0, 320, (13,), generator=gen).tolist()
    other_prompt = torch.randint(0, 320, (7,), generator=gen).tolist()
    tree = TreeShape.from_branching([2, 2, 1])
    root = 17
    nodes = torch.randint(0, 320, (tree.num_nodes,), generator=gen).tolist()
    runner.run([SeqInput(prompt, 0, tables, 1)])
    start = len(prompt)
    masks = ancestor_masks(tree.parents, with_root=True)
    logits = runner.run(
        [
            SeqInput([root, *nodes], start, tables, 1 + tree.num_nodes, masks),
            SeqInput(other_prompt, 0, other_tables, 1),
        ]
    )
    for node in range(-1, tree.num_nodes):
        path = _path(tree.parents, node)
        tokens = prompt + [root] + [nodes[i] for i in path]
        cache = ContiguousCache(target, len(tokens))
        want = forward_tokens(target, cache, tokens, 0)[-1]
        torch.testing.assert_close(logits[node + 1], want, rtol=1e-4, atol=1e-4)
    other = forward_tokens(target, ContiguousCache(target, 7), other_prompt, 0)[-1]
    torch.testing.assert_close(logits[-1], other, rtol=1e-4, atol=1e-4)

    accepted = _path(tree.parents, tree.num_nodes - 1)  # the deepest node's path
    move_accepted_kv(runner.kv_cache, [(tables, start, accepted)])
    chain = ModelRunner(
        target, num_blocks=40, block_size=4, max_num_seqs=4, max_num_batched_tokens=64,
        cuda_graphs=False,
    )  # fmt: skip
    chain.run([SeqInput(prompt + [root] + [nodes[i] for i in accepted], 0, tables, 1)])
    for group, table in enumerate(tables):
        for position in range(start, start + 1 + len(accepted)):
            block, offset = table[position // 4], position % 4
            torch.testing.assert_close(
                runner.kv_cache[:, :, block, offset],
                chain.kv_cache[:, :, block, offset],
                rtol=1e-5,
                atol=1e-5,
                msg=f"group {group} position {position}",
            )


def _path(parents, node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def test_move_accepted_kv_moves_an_fp8_cache_as_it_moves_a_float_one():
    gen = torch.Generator().manual_seed(4)
    exact = torch.randn(2, 2, 6, 4, 2, 8, generator=gen)  # [layers, 2, blocks, block, heads, dim]
    rounded = exact.to(torch.float8_e4m3fn)
    tables = ([1, 2, 3], [4, 5, 0])
    moves = [(tables, 5, [1, 3, 4])]  # nodes 1, 3, 4 accepted: they move to 0, 1, 2's slots
    move_accepted_kv(exact, moves)
    move_accepted_kv(rounded, moves)
    assert torch.equal(rounded.view(torch.uint8), exact.to(torch.float8_e4m3fn).view(torch.uint8))
