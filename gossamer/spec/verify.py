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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from gossamer.runner.sampler import (
    SamplingRow,
    TokenLogprobs,
    adjust_logits,
    exponential_noise,
    filtered_probs,
    token_logprobs,
)


def position_rows(row: SamplingRow, draft: Sequence[int]) -> list[SamplingRow]:
    """One sampling row per verified position: position j has drafts[:j] in its output."""
    if not draft:
        return [row]
    output = list(row.output_token_ids)
    return [replace(row, output_token_ids=output + list(draft[:j])) for j in range(len(draft) + 1)]


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


def verify(
    logits: torch.Tensor,  # [sum(k_i + 1), vocab] target logits, request by request
    rows: Sequence[SamplingRow],  # one per request
    drafts: Sequence[Sequence[int]],  # k_i draft tokens per request (may be empty)
    draft_probs: Sequence[torch.Tensor | None],  # [k_i, vocab] or None (point mass)
    shared_generator: torch.Generator,
) -> tuple[list[list[int]], list[list[TokenLogprobs | None]]]:
    """Tokens (accepted drafts + 1) and their logprobs per request."""
    all_rows = [
        r for row, draft in zip(rows, drafts, strict=True) for r in position_rows(row, draft)
    ]
    if logits.shape[0] != len(all_rows):
        raise ValueError(f"{logits.shape[0]} logits rows for {len(all_rows)} verified positions")
    raw = logits.float()
    processed = adjust_logits(raw, all_rows)
    argmax = processed.argmax(dim=-1).tolist()
    random_probs = _random_probs(processed, all_rows)
    tokens: list[list[int]] = []
    offset = random_offset = 0
    for row, draft, q in zip(rows, drafts, draft_probs, strict=True):
        span = len(draft) + 1
        if row.params.greedy:
            tokens.append(greedy_accept(argmax[offset : offset + span], draft))
        else:
            probs = random_probs[random_offset : random_offset + span]
            random_offset += span
            generator = row.generator or shared_generator
            if q is None or not draft:
                tokens.append(accept_point_mass(probs, draft, generator))
            else:
                probs = probs / probs.sum(dim=-1, keepdim=True)
                tokens.append(rejection_sample(probs, draft, q[: len(draft)], generator))
        offset += span
    return tokens, _emitted_logprobs(raw, all_rows, drafts, tokens)


def _random_probs(processed: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """Filtered (top-k/p, min-p), unnormalised probabilities [random rows, vocab] of the rows
    that sample at random, in order."""
    random_rows = [i for i, row in enumerate(rows) if not row.params.greedy]
    if not random_rows:
        return processed[:0]
    index = torch.tensor(random_rows, device=processed.device)
    return filtered_probs(processed[index], [rows[i] for i in random_rows])


def _emitted_logprobs(
    raw: torch.Tensor,
    all_rows: Sequence[SamplingRow],
    drafts: Sequence[Sequence[int]],
    tokens: Sequence[list[int]],
) -> list[list[TokenLogprobs | None]]:
    """Logprobs of each emitted token under the row that produced it (the raw model logits)."""
    picked_rows, picked_tokens, picked_index = [], [], []
    offset = 0
    for draft, emitted in zip(drafts, tokens, strict=True):
        for j, token in enumerate(emitted):
            picked_index.append(offset + j)
            picked_rows.append(all_rows[offset + j])
            picked_tokens.append(token)
        offset += len(draft) + 1
    if all(row.params.logprobs is None for row in picked_rows):
        flat: list[TokenLogprobs | None] = [None] * len(picked_rows)
    else:
        index = torch.tensor(picked_index, device=raw.device)
        flat = token_logprobs(raw[index], picked_tokens, picked_rows)
    out, cursor = [], 0
    for emitted in tokens:
        out.append(flat[cursor : cursor + len(emitted)])
        cursor += len(emitted)
    return out
