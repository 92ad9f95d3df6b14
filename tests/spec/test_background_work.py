"""Deferred proposer work (the suffix proposer's shared index) runs while the engine waits for
the GPU: `InFlightStep.sampled_token_ids(while_waiting)` calls it until the step's tokens are
ready or nothing is left, and the speculator hands it to the proposers that have any."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gossamer.engine.overlap import InFlightStep
from gossamer.spec.config import SpecConfig
from gossamer.spec.ngram import NgramProposer
from gossamer.spec.speculator import Speculator
from gossamer.spec.suffix import SuffixProposer


class FakeEvent:
    """A CUDA event that reports ready from its `ready_at`-th query on."""

    def __init__(self, ready_at: int) -> None:
        self.ready_at, self.queries, self.synchronized = ready_at, 0, False

    def query(self) -> bool:
        self.queries += 1
        return self.queries >= self.ready_at

    def synchronize(self) -> None:
        self.synchronized = True


def in_flight(event: FakeEvent) -> InFlightStep:
    items = [SimpleNamespace(request_id=rid) for rid in ("a", "b")]
    step = InFlightStep(SimpleNamespace(scheduled_requests=items), torch.tensor([5, 6]))
    step._event = event  # as on the GPU: the tokens are still on their way
    return step


def test_the_wait_runs_background_work_until_the_tokens_are_ready():
    calls = []
    step = in_flight(FakeEvent(ready_at=4))
    assert step.sampled_token_ids(lambda: calls.append(1) or True) == {"a": [5], "b": [6]}
    assert len(calls) == 3 and step._event.synchronized


def test_the_wait_stops_calling_work_that_has_nothing_left():
    calls = []
    step = in_flight(FakeEvent(ready_at=1000))
    assert step.sampled_token_ids(lambda: calls.append(1) or len(calls) < 2)["b"] == [6]
    assert len(calls) == 2 and step._event.queries == 2


def test_the_speculator_gives_background_work_to_the_proposers_that_have_some():
    suffix = SuffixProposer(4, max_depth=6)
    speculator = Speculator(
        SpecConfig(method="auto"), {"ngram": NgramProposer(4), "suffix": suffix}
    )
    assert speculator.background_work() is False  # nothing queued
    suffix.release("done", [1] + list(range(2, 40)), 1)
    chunks = 0
    while speculator.background_work():
        chunks += 1
    assert chunks > 1 and suffix.shared.backlog == 0


def test_work_fills_only_waits_that_have_lately_been_long(monkeypatch):
    """Where the host sets the pace its waits are short and a chunk of work would run past the
    tokens' arrival, lengthening every step: the work waits for longer waits."""
    from gossamer.engine import overlap

    clock = [0.0]
    monkeypatch.setattr(overlap.time, "perf_counter", lambda: clock[0])

    class TimedEvent(FakeEvent):
        def synchronize(self) -> None:
            clock[0] += self.wait_s
            super().synchronize()

    def wait(slack: overlap.HostSlack, wait_s: float) -> int:
        calls = []
        event = TimedEvent(ready_at=3)
        event.wait_s = wait_s
        slack.wait_for(in_flight(event), lambda: calls.append(1) or True)
        return len(calls)

    slack = overlap.HostSlack()
    assert wait(slack, 20e-6) == 0  # no long waits seen yet
    for _ in range(50):
        wait(slack, 20e-6)
    assert slack.average_s == pytest.approx(20e-6, rel=0.01) and wait(slack, 1e-3) == 0
    for _ in range(30):
        wait(slack, 1e-3)
    assert slack.average_s > overlap.MIN_SLACK_S and wait(slack, 1e-3) == 2
