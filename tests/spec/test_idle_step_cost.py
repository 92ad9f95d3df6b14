"""An idle step (applied while the next one runs, the guard or the batch limit keeping plain
decoding) costs the speculator its bookkeeping only: no loop over the requests unless one is new
or ended or the guard measures the step, and stats that write again only what such a step changes
(Speculator.after_step, Speculator.stats). Doing less must change nothing: the stats the engine
shows are those made in full after every step, the requests tracked are those the full loop
tracks, and greedy outputs stay those of plain decoding."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gossamer.sampling_params import SamplingParams
from gossamer.scheduler import Request
from gossamer.spec.config import SpecConfig
from gossamer.spec.ngram import NgramProposer
from gossamer.spec.speculator import Speculator, _decode_only
from tests.spec.conftest import make_engine, repetitive_prompts, run_engine
from tests.spec.test_guard import FakeClock
from tests.spec.test_idle_overlap import guarded_self_drafting

PLAIN_STEP, VERIFY_STEP = 1.0, 5.65  # fake seconds: speculation loses, the guard keeps plain


def guarded_engine(target, target_path):
    """auto (the target drafting for itself) with the measured guard on a fake clock where a
    verification step (5 tokens a request) takes 5.65 plain steps: its buckets turn plain,
    overlap, and still explore now and then."""
    spec = guarded_self_drafting(target_path, explore_every=12, explore_steps=3)
    engine = make_engine(target, spec, async_scheduling=True)
    clock = FakeClock()
    engine.speculator.clock = clock
    run = engine.runner.run

    def timed_run(seqs, **options):
        drafts = any(seq.num_logits > 1 for seq in seqs)
        clock.now += VERIFY_STEP if drafts else PLAIN_STEP
        return run(seqs, **options)

    engine.runner.run = timed_run
    return engine


def mixed_requests() -> dict[str, tuple[list[int], SamplingParams]]:
    """Three requests that end one after another (the batch shrinks: new buckets begin while
    idle), one of them with two choices (the second forks from the first mid-run)."""
    prompts = repetitive_prompts(3, seed=21)
    lengths = (40, 90, 130)
    return {
        str(i): (prompt, SamplingParams(temperature=0, max_tokens=count, ignore_eos=True, n=n))
        for i, (prompt, count, n) in enumerate(zip(prompts, lengths, (1, 2, 1), strict=True))
    }


class StepWatch:
    """Wraps the speculator's after_step: counts idle applies (the next step in flight) and
    checks that each was decode-only, as the idle bookkeeping assumes."""

    def __init__(self, speculator: Speculator) -> None:
        self.idle_steps = 0
        after_step = speculator.after_step

        def watched(scheduler, scheduled, sampled, row_for, next_in_flight=False):
            if next_in_flight:
                assert _decode_only(scheduled.scheduled_requests)
                self.idle_steps += 1
            return after_step(scheduler, scheduled, sampled, row_for, next_in_flight)

        speculator.after_step = watched


def test_engine_stats_are_current_after_every_step(target, target_path):
    """Through idle steps, speculating steps that follow them, buckets that begin while idle and
    a fork, the engine's spec stats after each step equal stats made in full; and a dict handed
    out is a snapshot that later steps leave as it was."""
    engine = guarded_engine(target, target_path)
    speculator = engine.speculator
    watch = StepWatch(speculator)
    for request_id, (prompt, params) in mixed_requests().items():
        engine.add_request(request_id, prompt, params)
    tokens: dict = {}
    speculated_after_idle = False
    while engine.has_unfinished_requests():
        before, idle_before = engine.stats.spec_stats, watch.idle_steps
        snapshot = dict(before)
        for out in engine.step():
            tokens.setdefault((out.request_id, out.index), []).extend(out.new_token_ids)
        stats = engine.stats.spec_stats
        assert stats == speculator._all_stats()
        assert before == snapshot  # not changed in place
        drafted = stats["num_drafts"] > before.get("num_drafts", 0)
        speculated_after_idle |= drafted and idle_before > 0
    assert watch.idle_steps > 20 and speculated_after_idle
    assert stats["num_idle_overlapped_steps"] == engine.num_overlapped_steps
    plain = make_engine(target, None, async_scheduling=True)
    assert tokens == run_engine(plain, mixed_requests())[0]


def test_an_abort_during_an_overlap_keeps_the_stats_current(target, target_path):
    """A request aborted between two idle steps ends while the next step is in flight: the
    speculator lets go of it and the stats stay those made in full."""
    engine = guarded_engine(target, target_path)
    watch = StepWatch(engine.speculator)
    for request_id, (prompt, params) in mixed_requests().items():
        engine.add_request(request_id, prompt, params)
    aborted = False
    while engine.has_unfinished_requests():
        if not aborted and engine._in_flight is not None and watch.idle_steps > 10:
            engine.abort("2")
            aborted = True
        engine.step()
        assert engine.stats.spec_stats == engine.speculator._all_stats()
    assert aborted and not engine.speculator._tracked


# ---- tracking ------------------------------------------------------------------------------------


def request(request_id: str) -> Request:
    return Request(request_id, [1, 2, 3], SamplingParams(max_tokens=4))


class Released(NgramProposer):
    def __init__(self) -> None:
        super().__init__(4)
        self.released: list[str] = []

    def release(self, request_id, token_ids, num_prompt_tokens) -> None:
        self.released.append(request_id)


def tracking_speculator() -> tuple[Speculator, Released]:
    proposer = Released()
    config = SpecConfig(method="ngram", num_speculative_tokens=4)
    return Speculator(config, {"n": proposer}), proposer


def step_of(*request_ids: str) -> SimpleNamespace:
    items = tuple(SimpleNamespace(request_id=request_id) for request_id in request_ids)
    return SimpleNamespace(scheduled_requests=items)


def scheduler_of(*requests: Request) -> SimpleNamespace:
    held = {r.request_id: r for r in requests}
    return SimpleNamespace(requests=held, get_request=held.get)


@pytest.mark.parametrize("sampled_ids", [("a", "b"), ("a",)], ids=["all sampled", "one sampled"])
def test_tracking_without_the_loop_tracks_what_the_loop_does(sampled_ids):
    """The step's requests as the scheduler holds them now: known ones (nothing to do), a new
    one, one that ended (left for _release_ended), one whose id came back as a new request (its
    predecessor released); the shortcut and the loop leave the same tracked requests."""
    a, b, b_again = request("a"), request("b"), request("b")
    cases = [
        ({"a": a, "b": b}, scheduler_of(a, b)),  # nothing new
        ({"a": a}, scheduler_of(a, b)),  # b is new
        ({"a": a, "b": b}, scheduler_of(a)),  # b ended
        ({"a": a, "b": b}, scheduler_of(a, b_again)),  # b came back
    ]
    for tracked, scheduler in cases:
        results = []
        for shortcut in (True, False):
            speculator, proposer = tracking_speculator()
            speculator._tracked = dict(tracked)
            if not shortcut:
                speculator._tracks_all = lambda *args: False
            sampled = {request_id: [0] for request_id in sampled_ids}
            speculator._track(scheduler, step_of("a", "b"), sampled)
            tracked_objects = {request_id: id(r) for request_id, r in speculator._tracked.items()}
            results.append((tracked_objects, proposer.released))
        assert results[0] == results[1]
        if scheduler.requests.get("b") is b_again:
            assert results[0] == ({"a": id(a), "b": id(b_again)}, ["b"])


# ---- the idle tick -------------------------------------------------------------------------------


def run_counting_ticks(target, target_path, ticks_on: bool):
    """mixed_requests through the guarded engine; (outputs, spec stats, idle ticks taken)."""
    engine = guarded_engine(target, target_path)
    speculator = engine.speculator
    tick, taken = speculator._idle_tick, []

    def counted(*args):
        done = ticks_on and tick(*args)
        taken.append(done)
        return done

    speculator._idle_tick = counted
    tokens = run_engine(engine, mixed_requests())[0]
    return tokens, engine.stats.spec_stats, sum(taken)


def test_the_idle_tick_does_what_the_full_after_step_does(target, target_path):
    """Speculator._idle_tick (an idle step's bookkeeping in one call) against the full after_step
    on the same fake clock: the same outputs, guard decisions and counters; and it is taken for
    most idle steps (continuation steps in a long plain window)."""
    tokens, stats, ticks = run_counting_ticks(target, target_path, ticks_on=True)
    full_tokens, full_stats, none = run_counting_ticks(target, target_path, ticks_on=False)
    assert none == 0
    assert tokens == full_tokens
    assert stats == full_stats
    # (39 of 62 here: the others measure the window's tail, or a request was new or ended)
    assert stats["num_idle_overlapped_steps"] > ticks > stats["num_idle_overlapped_steps"] / 2
