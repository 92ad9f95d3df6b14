"""Verification: the target's logits for the pending token and k drafts -> the accepted drafts and
one more token, with exactly the distribution that plain decoding would have.

The target scored positions 0..k of a request in one forward pass: row j holds the logits after
the pending token and drafts[:j]. Each row is processed like the sampler does for one token
(penalties and min_tokens see drafts[:j] as already generated, then temperature, top-k/p, min-p).

- Greedy: accept drafts while they equal the argmax; the first argmax that differs (or the one after
  the last draft) is the extra token. Exactly the tokens of plain greedy decoding.
- Random, draft with a distribution q (draft models): accept x_j with probability
  min(1, p_j(x_j) / q_j(x_j)); on rejection draw from norm(max(0, p_j - q_j)); if all k are
  accepted draw the extra token from p_k. The output then has distribution p exactly (Leviathan et
  al. 2023, Chen et al. 2023).
- Random, deterministic draft (a point mass: n-gram, suffix, greedy drafts): the same rule with
  q = one-hot(x_j) is "accept with probability p_j(x_j), else draw from p_j without x_j", which is
  the same as drawing y ~ p_j and accepting iff y == x_j (then y is the correction). We draw y
  with the sampler's own exponential race and the request's generator, one draw per emitted token,
  so a seeded request produces the very tokens it would produce without speculation.

Tree drafts (gossamer/spec/tree.py): row 0 holds the logits after the pending token (the root),
row 1 + i those after node i, whose history is the tokens of its path from the root. Verification
walks down from the root, at each node choosing among its children in order:
- Greedy: the child equal to the target's argmax, if any; else the argmax is the extra token. The
  accepted path is the longest whose every token is the argmax: plain greedy decoding again.
- Random, children with distributions (each child drawn from its q independently of its
  siblings): multi-candidate rejection sampling. With r = p, try each child x: accept it with
  probability min(1, r(x) / q(x)); on rejection r <- norm(max(0, r - q)) and try the next; when
  all are rejected the extra token is drawn from r. Each try is one speculative-sampling step
  whose target is the residual r, so what comes out has distribution p.
- Random, point-mass children (top-k children: what the draft and EAGLE-3 proposers build): the
  same rule with q = one-hot(x) accepts x with probability r(x) and otherwise removes x from r.
  Trying the children in turn is therefore one draw y ~ p, accepting the child equal to y (if
  none is, y is the extra token): one race draw per emitted token, as for point-mass chains, so a
  seeded request again produces the very tokens of plain decoding. NOTE: top-k children must be
  verified as point masses; taking q = the draft's softmax there would bias the output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import NamedTuple

import torch

from gossamer.runner.host_copy import to_device
from gossamer.runner.sampler import (
    SamplingRow,
    TokenLogprobs,
    adjust_logits,
    exponential_noise,
    filtered_probs,
    token_logprobs,
)


class Verified(NamedTuple):
    """Per request: the emitted tokens (accepted drafts + 1), their logprobs, and the accepted
    draft indices in order (a chain's first ones; a tree's path from the root)."""

    tokens: list[list[int]]
    logprobs: list[list[TokenLogprobs | None]]
    paths: list[list[int]]


def position_rows(
    row: SamplingRow, draft: Sequence[int], parents: Sequence[int] | None = None
) -> list[SamplingRow]:
    """One sampling row per verified position: position j has drafts[:j] in its output (a tree's
    row 1 + i: the tokens of node i's path). Where processing the logits reads no output tokens
    (`reads_output`), every position shares `row` itself: no copies of the output."""
    if not draft:
        return [row]
    if not reads_output(row):
        return [row] * (len(draft) + 1)
    output = list(row.output_token_ids)
    return [
        replace(row, output_token_ids=output + history) for history in _histories(draft, parents)
    ]


def reads_output(row: SamplingRow) -> bool:
    """Whether the logits processing of a row reads its output tokens (adjust_logits: penalties,
    or the stop tokens' ban while fewer than min_tokens are out). A position's drafts only add
    output tokens, so when the row itself is past min_tokens, every position is too."""
    params = row.params
    return params.uses_penalties or len(row.output_token_ids) < params.min_tokens


def argmax_only(row: SamplingRow) -> bool:
    """Greedy, nothing adjusted, no logprobs: verifying the row needs the argmax of the raw
    logits alone."""
    return row.params.greedy and row.params.logprobs is None and not reads_output(row)


def _histories(draft: Sequence[int], parents: Sequence[int] | None) -> list[list[int]]:
    """The drafts each verified position has seen: [[], drafts[:1], ...] or per tree node."""
    if parents is None:
        return [list(draft[:j]) for j in range(len(draft) + 1)]
    histories: list[list[int]] = [[]]
    for token, parent in zip(draft, parents, strict=True):
        histories.append(histories[parent + 1] + [token])
    return histories


def greedy_accept(target_argmax: Sequence[int], draft: Sequence[int]) -> list[int]:
    """target_argmax [k + 1] -> accepted drafts + the target's token at the first mismatch."""
    for j, token in enumerate(draft):
        if target_argmax[j] != token:
            return [*draft[:j], target_argmax[j]]
    return [*draft, target_argmax[len(draft)]]


def race(probs: torch.Tensor, generator: torch.Generator) -> int:
    """A draw from the (not necessarily normalised) probs [vocab], as the sampler draws."""
    noise = exponential_noise(probs.shape[-1], generator).to(probs.device)
    return int((probs / noise).argmax())


def accept_point_mass(
    probs: torch.Tensor, draft: Sequence[int], generator: torch.Generator
) -> list[int]:
    """probs [k + 1, vocab] target distributions (unnormalised is fine) -> tokens."""
    tokens: list[int] = []
    for j in range(len(draft) + 1):
        token = race(probs[j], generator)
        tokens.append(token)
        if j == len(draft) or token != draft[j]:
            return tokens
    return tokens


def rejection_sample(
    probs: torch.Tensor,  # [k + 1, vocab] target, rows sum to 1
    draft: Sequence[int],  # [k]
    draft_probs: torch.Tensor,  # [k, vocab] the distributions the drafts were drawn from
    generator: torch.Generator,
) -> list[int]:
    """Speculative rejection sampling: accepted drafts + one token, distributed as `probs`."""
    tokens: list[int] = []
    for j, token in enumerate(draft):
        p, q = float(probs[j, token]), float(draft_probs[j, token])
        uniform = float(torch.rand(1, generator=generator))
        if q > 0 and uniform * q < p:  # accept with probability min(1, p / q)
            tokens.append(token)
            continue
        residual = (probs[j] - draft_probs[j].to(probs.device)).clamp_min(0)
        if float(residual.sum()) <= 0:  # p <= q everywhere means p == q: cannot happen but in
            residual = probs[j]  # rounding; p itself is then the right law
        tokens.append(race(residual, generator))
        return tokens
    tokens.append(race(probs[len(draft)], generator))
    return tokens


Pick = Callable[[int, list[int]], tuple[int, int | None]]


def walk_tree(parents: Sequence[int], pick: Pick) -> tuple[list[int], list[int]]:
    """(emitted tokens, accepted nodes) of a tree walk from the root. `pick(row, children)` gets
    the logits row of the current node (0: the root, 1 + i: node i) and its children in order,
    and returns the token it emits there and the child it accepts (None: the walk ends)."""
    children: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for node, parent in enumerate(parents):
        children[parent + 1].append(node)
    emitted: list[int] = []
    path: list[int] = []
    row = 0
    while True:
        token, child = pick(row, children[row])
        emitted.append(token)
        if child is None:
            return emitted, path
        path.append(child)
        row = child + 1


def _child_with(token: int, children: list[int], draft: Sequence[int]) -> int | None:
    return next((child for child in children if draft[child] == token), None)


def greedy_accept_tree(
    target_argmax: Sequence[int], draft: Sequence[int], parents: Sequence[int]
) -> tuple[list[int], list[int]]:
    """target_argmax [n + 1] -> (tokens, accepted nodes): the longest argmax path + 1 token."""

    def pick(row: int, children: list[int]) -> tuple[int, int | None]:
        token = target_argmax[row]
        return token, _child_with(token, children, draft)

    return walk_tree(parents, pick)


def accept_point_mass_tree(
    probs: torch.Tensor,  # [n + 1, vocab] target distributions (unnormalised is fine)
    draft: Sequence[int],
    parents: Sequence[int],
    generator: torch.Generator,
) -> tuple[list[int], list[int]]:
    """Top-k children: one race draw per node on the path (see the module doc)."""

    def pick(row: int, children: list[int]) -> tuple[int, int | None]:
        token = race(probs[row], generator)
        return token, _child_with(token, children, draft)

    return walk_tree(parents, pick)


def rejection_sample_tree(
    probs: torch.Tensor,  # [n + 1, vocab] target, rows sum to 1
    draft: Sequence[int],  # [n]
    parents: Sequence[int],  # [n]
    draft_probs: torch.Tensor,  # [n, vocab] row i: the distribution node i was drawn from
    generator: torch.Generator,
) -> tuple[list[int], list[int]]:
    """Multi-candidate rejection sampling down the tree (see the module doc)."""

    def pick(row: int, children: list[int]) -> tuple[int, int | None]:
        residual = probs[row]
        for child in children:
            token, q = draft[child], draft_probs[child].to(residual.device)
            p_token, q_token = float(residual[token]), float(q[token])
            if q_token > 0 and float(torch.rand(1, generator=generator)) * q_token < p_token:
                return token, child
            rest = (residual - q).clamp_min(0)
            total = float(rest.sum())
            if total > 0:  # else residual == q up to rounding: keep it (see rejection_sample)
                residual = rest / total
        return race(residual, generator), None

    return walk_tree(parents, pick)


def verify(
    logits: torch.Tensor,  # [sum(k_i + 1), vocab] target logits, request by request
    rows: Sequence[SamplingRow],  # one per request
    drafts: Sequence[Sequence[int]],  # k_i draft tokens per request (may be empty)
    draft_probs: Sequence[torch.Tensor | None],  # [k_i, vocab] or None (point mass)
    shared_generator: torch.Generator,
    parents: Sequence[Sequence[int] | None] | None = None,  # per request: a tree's, None: chain
    logits_rows: Sequence[int] | None = None,
) -> Verified:
    """Tokens (accepted drafts + 1), their logprobs and the accepted drafts per request.
    `logits_rows`: the row of `logits` of each verified position, when `logits` holds more
    rows (a padded step's filler); None: its rows are the positions, in order."""
    trees = parents if parents is not None else [None] * len(drafts)
    all_rows = [
        r
        for row, draft, tree in zip(rows, drafts, trees, strict=True)
        for r in position_rows(row, draft, tree)
    ]
    _check_logits_rows(logits, len(all_rows), logits_rows)
    raw = random_probs = None
    if all(argmax_only(row) for row in rows):
        # NOTE: the argmax of every row, filler too, then the positions' on the host: one
        # reduction and one read, no gather (float32 holds any logits dtype exactly)
        argmax = logits.argmax(dim=-1).tolist()
        if logits_rows is not None:
            argmax = [argmax[row] for row in logits_rows]
    else:
        if logits_rows is not None:
            logits = logits[to_device(logits_rows, logits.device)]
        raw = logits.float()
        processed = adjust_logits(raw, all_rows)
        argmax = processed.argmax(dim=-1).tolist()
        random_probs = _random_probs(processed, all_rows)
    tokens: list[list[int]] = []
    paths: list[list[int]] = []
    offset = random_offset = 0
    for row, draft, q, tree in zip(rows, drafts, draft_probs, trees, strict=True):
        span = len(draft) + 1
        if row.params.greedy:
            emitted, path = _accept_greedy(argmax[offset : offset + span], draft, tree)
        else:
            probs = random_probs[random_offset : random_offset + span]
            random_offset += span
            generator = row.generator or shared_generator
            emitted, path = _accept_random(probs, draft, q, tree, generator)
        tokens.append(emitted)
        paths.append(path)
        offset += span
    return Verified(tokens, _emitted_logprobs(raw, all_rows, drafts, tokens, paths), paths)


def _check_logits_rows(
    logits: torch.Tensor, num_positions: int, logits_rows: Sequence[int] | None
) -> None:
    if logits_rows is None and logits.shape[0] != num_positions:
        raise ValueError(f"{logits.shape[0]} logits rows for {num_positions} verified positions")
    if logits_rows is not None and len(logits_rows) != num_positions:
        raise ValueError(f"{len(logits_rows)} logits rows named for {num_positions} positions")


def _accept_greedy(
    argmax: Sequence[int], draft: Sequence[int], tree: Sequence[int] | None
) -> tuple[list[int], list[int]]:
    if tree is not None:
        return greedy_accept_tree(argmax, draft, tree)
    emitted = greedy_accept(argmax, draft)
    return emitted, list(range(len(emitted) - 1))


def _accept_random(
    probs: torch.Tensor,  # [k + 1, vocab] filtered, unnormalised
    draft: Sequence[int],
    q: torch.Tensor | None,
    tree: Sequence[int] | None,
    generator: torch.Generator,
) -> tuple[list[int], list[int]]:
    if tree is not None and q is None:
        return accept_point_mass_tree(probs, draft, tree, generator)
    if tree is not None:
        probs = probs / probs.sum(dim=-1, keepdim=True)
        return rejection_sample_tree(probs, draft, tree, q[: len(draft)], generator)
    if q is None or not draft:
        emitted = accept_point_mass(probs, draft, generator)
    else:
        probs = probs / probs.sum(dim=-1, keepdim=True)
        emitted = rejection_sample(probs, draft, q[: len(draft)], generator)
    return emitted, list(range(len(emitted) - 1))


def _random_probs(processed: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """Filtered (top-k/p, min-p), unnormalised probabilities [random rows, vocab] of the rows
    that sample at random, in order."""
    random_rows = [i for i, row in enumerate(rows) if not row.params.greedy]
    if not random_rows:
        return processed[:0]
    index = torch.tensor(random_rows, device=processed.device)
    return filtered_probs(processed[index], [rows[i] for i in random_rows])


def _emitted_logprobs(
    raw: torch.Tensor | None,  # None: no row wants logprobs
    all_rows: Sequence[SamplingRow],
    drafts: Sequence[Sequence[int]],
    tokens: Sequence[list[int]],
    paths: Sequence[list[int]],
) -> list[list[TokenLogprobs | None]]:
    """Logprobs of each emitted token under the row that produced it (the raw model logits): the
    root's row for the first, then the row of each accepted draft."""
    if raw is None or all(row.params.logprobs is None for row in all_rows):
        return [[None] * len(emitted) for emitted in tokens]
    picked_rows, picked_tokens, picked_index = [], [], []
    offset = 0
    for draft, emitted, path in zip(drafts, tokens, paths, strict=True):
        for row, token in zip([0, *(1 + node for node in path)], emitted, strict=True):
            picked_index.append(offset + row)
            picked_rows.append(all_rows[offset + row])
            picked_tokens.append(token)
        offset += len(draft) + 1
    index = torch.tensor(picked_index, device=raw.device)
    flat = token_logprobs(raw[index], picked_tokens, picked_rows)
    out, cursor = [], 0
    for emitted in tokens:
        out.append(flat[cursor : cursor + len(emitted)])
        cursor += len(emitted)
    return out
