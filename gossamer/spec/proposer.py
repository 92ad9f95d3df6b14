"""The one interface every proposer implements, and what crosses it.

A proposer sees a batch of requests that sit at the end of their known tokens (the target has
computed all but the last token, which it feeds next step) and returns up to `max_draft_tokens`
guesses of the tokens that follow, or None when it has nothing worth verifying. After the target
has verified a draft, the proposer hears how many tokens it accepted; when a request ends it hears
that too (and may learn from the request's output).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from gossamer.runner.sampler import SamplingRow
    from gossamer.scheduler import SchedulerOutput


@dataclass
class Draft:
    """Guessed tokens. `probs` is the distribution each token was drawn from ([k, vocab], target
    vocabulary, rows sum to 1), needed for exact rejection sampling; None means the proposer picked
    them deterministically (a point mass: n-gram lookups, greedy drafts, top-k tree children).

    `parents` makes it a tree draft (gossamer/spec/tree.py): token i follows token parents[i]
    (-1: the request's pending token), in breadth-first order; a tree's `probs` row i is the
    distribution node i was drawn from independently of its siblings. None: a chain."""

    token_ids: list[int]
    probs: torch.Tensor | None = None
    parents: list[int] | None = None


@dataclass
class SpecRequest:
    """One request as a proposer sees it."""

    request_id: str
    # prompt + output, the scheduler's own list: read it, never change it.
    token_ids: list[int]
    num_prompt_tokens: int
    max_draft_tokens: int  # >= 1
    row: SamplingRow  # sampling params and the request's generator (for drafts that sample)


class Proposer(Protocol):
    """What the speculator calls. `name` is the method name of the config ("ngram", ...)."""

    name: str

    def propose(self, requests: Sequence[SpecRequest]) -> list[Draft | None]:
        """One draft (or None) per request, in order."""
        ...

    def feedback(self, request_id: str, num_drafted: int, num_accepted: int) -> None:
        """The target accepted `num_accepted` of the `num_drafted` tokens last proposed."""
        ...

    def release(self, request_id: str, token_ids: Sequence[int], num_prompt_tokens: int) -> None:
        """The request ended (finished or aborted): drop its state; `token_ids` is its final
        prompt + output."""
        ...

    def observe(self, scheduled: SchedulerOutput, live: dict[str, list[int]]) -> None:
        """Called after every step, speculating or not (EAGLE reads the target's hidden states
        here). `live` maps each still-running scheduled request to its tokens."""
        ...

    def accepted_paths(self, paths: dict[str, list[int]]) -> None:
        """After a step that verified tree drafts, before `observe`: per request, the accepted
        nodes in path order. The step fed node i as its token 1 + i; the KV of the path has
        since moved to tokens 1, 2, ... (a chain's places), per-token outputs have not."""
        ...

    def background_work(self) -> bool:
        """A small chunk of deferred work (index upkeep), done while the engine waits for the
        GPU; whether more is left."""
        ...


class BaseProposer:
    """No-op feedback, release, observe and accepted_paths, for proposers that need none."""

    name = "base"

    def propose(self, requests: Sequence[SpecRequest]) -> list[Draft | None]:
        raise NotImplementedError

    def feedback(self, request_id: str, num_drafted: int, num_accepted: int) -> None:
        return None

    def release(self, request_id: str, token_ids: Sequence[int], num_prompt_tokens: int) -> None:
        return None

    def observe(self, scheduled: SchedulerOutput, live: dict[str, list[int]]) -> None:
        return None

    def accepted_paths(self, paths: dict[str, list[int]]) -> None:
        return None

    def background_work(self) -> bool:
        return False
