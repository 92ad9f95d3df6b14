"""Drawing draft tokens from a draft model's logits (draft model and EAGLE-3 share this).

Greedy requests get the argmax (a point mass: verification compares with the target's argmax).
Random requests draw from q = the draft's distribution after the request's temperature, top-k,
top-p and min-p, with the request's own generator, and hand q on: exact rejection sampling needs
the very distribution each draft was drawn from. Penalties are left out of q; that only changes
how often drafts are accepted, never the output distribution.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gossamer.runner.sampler import SamplingRow, filter_probs
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
