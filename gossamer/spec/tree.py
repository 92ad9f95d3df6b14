"""Tree drafts: the static shape of a draft tree, the attention masks of its nodes, and how the
accepted path's KV ends up where a chain's would be.

A tree draft guesses several continuations at once. Node i is a token; its parent is the token
before it (-1: the request's pending token, the root). Nodes are numbered breadth first, so a
parent comes before its children, the nodes of one depth are contiguous, and every prefix of the
numbering is itself a tree (the scheduler may cut the tail of a draft for budget or blocks).

Shapes (`"tree"` in the speculative config):
- `{"branching": [3, 2, 1, 1]}`: the root gets its 3 most likely next tokens, each of those its 2
  most likely, then one each twice: 3 + 6 + 6 + 6 = 21 nodes, depth 4;
- `{"paths": [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]}`: EAGLE-style static trees; a path
  lists ranks from the root ([0, 1]: the second most likely child of the most likely child),
  and every prefix of a path must be a path too.

In a step the target feeds the root and the nodes at positions start .. start + n ("slots", as
a chain of n drafts would) but computes node i at the position of its depth (start + depth) and
lets it attend to the committed prefix and its own ancestors only (`ancestor_masks`). After
verification the accepted nodes' KV is copied to the slots a chain would have used
(`move_accepted_kv`); the scheduler then rolls back everything after them like rejected drafts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch only where KV moves (the config imports this module)
    import torch

# The root and the nodes of one step share an int64 attention bitmask (bit 63, the sign, unused).
MAX_TREE_NODES = 62


class TreeShapeError(ValueError):
    """A tree shape that cannot be built; the message says what is wrong."""


@dataclass(frozen=True)
class TreeShape:
    """Node i is its parent's `ranks[i]`-th most likely next token (0: the most likely);
    `parents[i]` is -1 for children of the root. Breadth-first order (see the module doc)."""

    parents: tuple[int, ...]
    ranks: tuple[int, ...]

    def __post_init__(self) -> None:
        if not 1 <= len(self.parents) <= MAX_TREE_NODES:
            raise TreeShapeError(f"must have 1 to {MAX_TREE_NODES} nodes, not {len(self.parents)}")
        if len(self.ranks) != len(self.parents) or min(self.ranks) < 0:
            raise TreeShapeError("needs one rank >= 0 per node")
        depths = self.depths
        for node, parent in enumerate(self.parents):
            if not -1 <= parent < node or (node and depths[node] < depths[node - 1]):
                raise TreeShapeError("nodes must be in breadth-first order")
        siblings = list(zip(self.parents, self.ranks, strict=True))
        if len(set(siblings)) != len(siblings):
            raise TreeShapeError("two children of one node have the same rank")

    @classmethod
    def from_branching(cls, branching: Sequence[int]) -> TreeShape:
        """branching[d]: the children of every node of depth d (the root has depth 0)."""
        if not branching or any(not isinstance(b, int) or b < 1 for b in branching):
            raise TreeShapeError("branching must be a non-empty list of integers >= 1")
        parents: list[int] = []
        ranks: list[int] = []
        level = [-1]
        for width in branching:
            next_level = []
            for parent in level:
                for rank in range(width):
                    next_level.append(len(parents))
                    parents.append(parent)
                    ranks.append(rank)
                    if len(parents) > MAX_TREE_NODES:
                        raise TreeShapeError(f"has more than {MAX_TREE_NODES} nodes")
            level = next_level
        return cls(tuple(parents), tuple(ranks))

    @classmethod
    def from_paths(cls, paths: Sequence[Sequence[int]]) -> TreeShape:
        """One path of ranks from the root per node; every prefix of a path must be listed."""
        unique = {tuple(path) for path in paths}
        if not paths or len(unique) != len(paths) or () in unique:
            raise TreeShapeError("paths must be distinct and non-empty")
        if any(not isinstance(rank, int) or rank < 0 for path in unique for rank in path):
            raise TreeShapeError("paths hold ranks: integers >= 0")
        index: dict[tuple[int, ...], int] = {(): -1}
        parents: list[int] = []
        ranks: list[int] = []
        for depth in range(1, max(len(path) for path in unique) + 1):
            level = [path for path in unique if len(path) == depth]
            missing = [list(path) for path in level if path[:-1] not in index]
            if missing:
                raise TreeShapeError(f"path {missing[0]} needs its prefix {missing[0][:-1]}")
            for path in sorted(level, key=lambda path: (index[path[:-1]], path[-1])):
                index[path] = len(parents)
                parents.append(index[path[:-1]])
                ranks.append(path[-1])
        return cls(tuple(parents), tuple(ranks))

    @cached_property
    def depths(self) -> tuple[int, ...]:
        """Depth of each node: 1 for children of the root."""
        return tuple(node_depths(self.parents))

    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    @property
    def max_depth(self) -> int:
        return self.depths[-1]

    def num_nodes_within(self, depth: int) -> int:
        """How many nodes have depth <= `depth` (they are the first ones)."""
        return sum(d <= depth for d in self.depths)

    def level(self, depth: int, num_nodes: int) -> range:
        """The nodes of `depth` among the first `num_nodes`."""
        first = self.num_nodes_within(depth - 1)
        return range(first, max(first, min(self.num_nodes_within(depth), num_nodes)))


def parse_tree(value: object) -> TreeShape | None:
    """None, a TreeShape, {"branching": [...]} or {"paths": [[...], ...]} -> TreeShape | None."""
    if value is None or isinstance(value, TreeShape):
        return value
    if isinstance(value, dict) and set(value) == {"branching"}:
        return TreeShape.from_branching(list(value["branching"]))
    if isinstance(value, dict) and set(value) == {"paths"}:
        return TreeShape.from_paths([list(path) for path in value["paths"]])
    raise TreeShapeError(
        'must be {"branching": [3, 2, 1, 1]} (top-k children per depth) or '
        '{"paths": [[0], [1], [0, 0]]} (rank paths from the root)'
    )


def node_depths(parents: Sequence[int]) -> list[int]:
    """Depth of each node of a breadth-first tree: 1 for children of the root."""
    depths: list[int] = []
    for parent in parents:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths


def tree_depth(parents: Sequence[int]) -> int:
    """The depth of the deepest node (0 for no nodes)."""
    return max(node_depths(parents), default=0)


def ancestor_masks(parents: Sequence[int], with_root: bool) -> tuple[int, ...]:
    """Per fed token, the int64 bitmask of the step's fed tokens it attends to (bit j: fed token
    j): itself and its ancestors. `with_root`: the step feeds the root (the pending token) before
    the nodes, as verification does; else it feeds the nodes only (the root is in the cache, as
    when a proposer grows its tree). A token's depth in the step is its popcount - 1."""
    offset = 1 if with_root else 0
    masks = [1] if with_root else []
    for node, parent in enumerate(parents):
        inherited = masks[parent + offset] if parent >= 0 else masks[0] if with_root else 0
        masks.append(inherited | 1 << (node + offset))
    return tuple(masks)


def chain_moves(path: Sequence[int]) -> list[tuple[int, int]]:
    """(from, to) offsets after the step's first slot for an accepted path of nodes: node path[j]
    was fed at offset 1 + path[j] and must hold offset 1 + j, a chain's place. Breadth-first
    numbering gives path[j] >= j, so no source lies below its destination."""
    return [(1 + node, 1 + j) for j, node in enumerate(path) if node != j]


def move_accepted_kv(
    kv_cache: torch.Tensor,  # [layers_per_group, 2, num_blocks, block_size, kv_heads, head_dim]
    moves: Sequence[tuple[Sequence[Sequence[int]], int, Sequence[int]]],
) -> None:
    """For each (block tables per group, the step's first slot position, accepted path): copy the
    KV of the accepted nodes to the slots a chain would have used. Every layer of every group
    moves (a block belongs to one group, so the other groups' rows there are unused)."""
    import torch

    block_size = kv_cache.shape[3]
    num_groups = len(moves[0][0]) if moves else 0
    sources: list[list[int]] = [[] for _ in range(num_groups)]
    targets: list[list[int]] = [[] for _ in range(num_groups)]
    for tables, start, path in moves:
        for source, target in chain_moves(path):
            for group, table in enumerate(tables):
                for slots, position in ((sources, start + source), (targets, start + target)):
                    slots[group].append(
                        int(table[position // block_size]) * block_size + position % block_size
                    )
    flat = kv_cache.flatten(2, 3)  # [layers, 2, slots, kv_heads, head_dim], a view
    if flat.element_size() == 1:  # an fp8 cache moves as bytes: every backend indexes uint8
        flat = flat.view(torch.uint8)
    for source, target in zip(sources, targets, strict=True):
        if source:
            # NOTE: the gather on the right is a copy, so overlapping moves read the old values
            from_slots = torch.tensor(source, device=kv_cache.device)
            flat[:, :, torch.tensor(target, device=kv_cache.device)] = flat[:, :, from_slots]
