"""Drawing draft tokens from a draft model's logits (draft model and EAGLE-3 share this).

Greedy requests get the argmax (a point mass: verification compares with the target's argmax).
Random requests draw from q = the draft's distribution after the request's temperature, top-k,
top-p and min-p, with the request's own generator, and hand q on: exact rejection sampling needs
the very distribution each draft was drawn from. Penalties are left out of q; that only changes
how often drafts are accepted, never the output distribution.

Tree drafts (`grow_trees`) take the top-k tokens of the draft's logits at every node instead, for
greedy and random requests alike: point masses, which verification handles exactly (verify.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from gossamer.runner.sampler import SamplingRow, filter_probs
from gossamer.spec.tree import TreeShape
from gossamer.spec.verify import race


def draw_drafts(
    logits: torch.Tensor,  # [n, vocab] float32, one row per request
    rows: Sequence[SamplingRow],
    shared_generator: torch.Generator,
) -> tuple[list[int], list[torch.Tensor | None]]:
    """One draft token per row, and the distribution it came from (None for greedy rows)."""
    tokens = logits.argmax(dim=-1).tolist()
    probs: list[torch.Tensor | None] = [None] * len(rows)
    random_rows = [i for i, row in enumerate(rows) if not row.params.greedy]
    if not random_rows:
        return tokens, probs
    index = torch.tensor(random_rows, device=logits.device)
    temperature = torch.tensor(
        [rows[i].params.temperature for i in random_rows], device=logits.device
    )
    q = torch.softmax(logits[index].float() / temperature[:, None], dim=-1)
    q = filter_probs(q, [rows[i] for i in random_rows])
    q = q / q.sum(dim=-1, keepdim=True)
    for j, i in enumerate(random_rows):
        generator = rows[i].generator or shared_generator
        tokens[i] = race(q[j], generator)
        probs[i] = q[j]
    return tokens, probs


def stack_probs(probs: Sequence[torch.Tensor | None]) -> torch.Tensor | None:
    """[k, vocab] from per-position distributions; None when the drafts were greedy."""
    if not probs or probs[0] is None:
        return None
    return torch.stack(list(probs))


def top_k_children(
    logits: torch.Tensor,  # [parents, vocab]
    parent_rows: Sequence[int],  # per child: its parent's row of `logits`
    ranks: Sequence[int],  # per child: its rank among the parent's next tokens
) -> list[int]:
    """Per child, the ranks[j]-th most likely token after its parent."""
    k = min(max(ranks) + 1, logits.shape[-1])
    top = logits.topk(k, dim=-1).indices  # [parents, k]
    rows = torch.tensor(parent_rows, device=logits.device)
    return top[rows, torch.tensor(ranks, device=logits.device)].tolist()


# score(requests, tokens) -> the logits after each node of the deepest level so far of each of
# `requests` (indices), request by request: [sum of those nodes, vocab]
LevelScorer = Callable[[list[int], list[list[int]]], torch.Tensor]


def grow_trees(
    shape: TreeShape,
    sizes: Sequence[int],  # per request: it gets the shape's first sizes[r] nodes (>= 1)
    root_logits: torch.Tensor,  # [requests, vocab] the logits after each request's root
    score: LevelScorer,
) -> list[list[int]]:
    """Top-k tree drafts, one depth at a time: the nodes of depth d are the top-ranked tokens
    after their parents, and `score` runs the draft on every request that grows deeper (its
    tokens so far, all depths) for the logits after the nodes of depth d."""
    tokens: list[list[int]] = [[] for _ in sizes]
    logits = root_logits
    rows: list[dict[int, int]] = [{-1: r} for r in range(len(sizes))]  # node -> row of logits
    for depth in range(1, shape.max_depth + 1):
        owners, parent_rows, ranks = [], [], []
        for r, size in enumerate(sizes):
            for node in shape.level(depth, size):
                owners.append(r)
                parent_rows.append(rows[r][shape.parents[node]])
                ranks.append(shape.ranks[node])
        if not owners:
            break
        for r, token in zip(owners, top_k_children(logits, parent_rows, ranks), strict=True):
            tokens[r].append(token)
        deeper = [r for r, size in enumerate(sizes) if shape.level(depth + 1, size)]
        if not deeper:
            break
        logits = score(deeper, tokens)
        rows = [{} for _ in sizes]
        cursor = 0
        for r in deeper:
            for node in shape.level(depth, sizes[r]):
                rows[r][node] = cursor
                cursor += 1
    return tokens
