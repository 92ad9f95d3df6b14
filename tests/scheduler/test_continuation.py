"""Scheduler.schedule_continuation (overlapped scheduling): step N + 1 is scheduled and run before
step N's tokens are applied, as the engine does on the GPU. The fake runner executes steps in that
order (the device's stream order), feeding each continuation the tokens the previous step sampled
(the engine's device-to-device copy), so any wrong slot, early-freed block or lost token changes
the outputs compared with the reference."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gossamer.cache import KVCacheLayout, KVCacheManager
from gossamer.scheduler import CONTINUATION_TOKEN_ID, FinishReason, Scheduler, SchedulerOutput
from tests.scheduler.fake_model import FakeRunner
from tests.scheduler.test_scheduler import EOS, add, assert_pool_empty, check_step, expected, make


def is_plain_decode(output: SchedulerOutput) -> bool:
    scheduled = output.scheduled_requests
    return (
        bool(scheduled)
        and not output.preempted_request_ids
        and all(
            s.num_new_tokens == 1 and s.do_sample and not s.num_draft_tokens and not s.is_new
            for s in scheduled
        )
    )


def feed_from_device(output: SchedulerOutput, sampled: dict[str, list[int]]) -> SchedulerOutput:
    """The continuation with the previous step's tokens in place of the placeholders."""
    scheduled = []
    for item in output.scheduled_requests:
        assert item.token_ids == [CONTINUATION_TOKEN_ID]
        scheduled.append(item._replace(token_ids=sampled[item.request_id][-1:]))
    return SchedulerOutput(
        output.step, tuple(scheduled), output.num_decode_requests, output.num_scheduled_tokens
    )


class OverlappedDriver:
    """The engine's overlapped loop around a scheduler and the fake runner."""

    def __init__(self, scheduler: Scheduler, runner: FakeRunner) -> None:
        self.scheduler, self.runner = scheduler, runner
        self.outputs: dict[str, list[int]] = {}
        self.reasons: dict[str, FinishReason] = {}
        self.in_flight: tuple[SchedulerOutput, dict[str, list[int]]] | None = None
        self.num_overlapped = self.num_preempted = 0

    def step(self) -> None:
        if self.in_flight is None:
            output = self.scheduler.schedule()
            check_step(self.scheduler, output)
            self.num_preempted += len(output.preempted_request_ids)
            sampled = self.runner.execute(output)
            if not is_plain_decode(output):
                self._apply(output, sampled)
                return
            self.in_flight = (output, sampled)
        previous, sampled = self.in_flight
        self.in_flight = None
        following = self.scheduler.schedule_continuation(previous)
        if following is not None:
            check_step(self.scheduler, following)
            fed = feed_from_device(following, sampled)
            self.in_flight = (following, self.runner.execute(fed))
            self.num_overlapped += 1
        self._apply(previous, sampled)

    def busy(self) -> bool:
        return self.scheduler.has_unfinished_requests() or self.in_flight is not None

    def _apply(self, output: SchedulerOutput, sampled: dict[str, list[int]]) -> None:
        for update in self.scheduler.update(output, sampled):
            self.outputs.setdefault(update.request_id, []).extend(update.new_token_ids)
            if update.finished:
                self.reasons[update.request_id] = update.finish_reason


def run_overlapped(scheduler: Scheduler, runner: FakeRunner, before_step=None) -> OverlappedDriver:
    driver = OverlappedDriver(scheduler, runner)
    for _ in range(3000):
        if not driver.busy():
            return driver
        if before_step is not None:
            before_step(scheduler)
        driver.step()
    raise AssertionError("requests still unfinished after 3000 steps")


def test_overlapped_decodes_match_the_reference_with_eos_and_length_finishes():
    scheduler, runner = make(budget=32, window=8)
    prompts = {f"r{i}": [i + 1, 2 * i + 3, 7] * (i + 1) for i in range(6)}
    for i, (request_id, prompt) in enumerate(prompts.items()):
        add(scheduler, request_id, prompt, max_tokens=10 + 3 * i)
    driver = run_overlapped(scheduler, runner)
    for i, (request_id, prompt) in enumerate(prompts.items()):
        assert driver.outputs[request_id] == expected(prompt, scheduler, max_tokens=10 + 3 * i)
    assert FinishReason.STOP in driver.reasons.values()  # some stopped on EOS
    assert driver.num_overlapped > 10
    assert_pool_empty(scheduler)


def test_a_request_stopping_on_the_previous_token_drops_its_extra_token():
    scheduler, runner = make()
    add(scheduler, "a", [1, 2, 3], max_tokens=6, ignore_eos=True)
    add(scheduler, "b", [4, 5], max_tokens=9, ignore_eos=True)
    driver = run_overlapped(scheduler, runner)
    assert len(driver.outputs["a"]) == 6 and len(driver.outputs["b"]) == 9
    assert driver.outputs["b"] == expected([4, 5], scheduler, max_tokens=9, ignore_eos=True)
    assert_pool_empty(scheduler)


def test_continuation_declines_for_waiting_requests_and_near_the_context_end():
    scheduler, runner = make(max_model_len=12)
    add(scheduler, "a", [1] * 9, max_tokens=None, ignore_eos=True)
    first = scheduler.schedule()
    scheduler.update(first, runner.execute(first))
    decode = scheduler.schedule()  # feeds position 9; position 10 is still inside the context
    sampled = runner.execute(decode)
    add(scheduler, "late", [2] * 3)
    assert scheduler.schedule_continuation(decode) is None  # "late" waits: schedule() decides
    scheduler.abort("late")
    following = scheduler.schedule_continuation(decode)
    assert following is not None and following.scheduled_requests[0].start_position == 10
    scheduler.update(decode, sampled)
    # positions 10 (in flight) and 11 fill the context of 12: no step may follow position 11
    last = scheduler.schedule_continuation(following)
    assert last is not None and last.scheduled_requests[0].start_position == 11
    assert scheduler.schedule_continuation(last) is None


def test_preemption_falls_back_to_schedule_and_keeps_every_output():
    scheduler, runner = make(num_blocks=14, budget=12, window=8)
    rng = random.Random(0)
    prompts = {f"r{i}": [rng.randrange(30) for _ in range(rng.randrange(3, 12))] for i in range(8)}
    for request_id, prompt in prompts.items():
        add(scheduler, request_id, prompt, max_tokens=14, ignore_eos=True)
    driver = run_overlapped(scheduler, runner)
    assert driver.num_preempted > 0 and driver.num_overlapped > 0
    for request_id, prompt in prompts.items():
        truth = expected(prompt, scheduler, max_tokens=14, ignore_eos=True)
        assert driver.outputs[request_id] == truth
    assert_pool_empty(scheduler)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10**6),
    block_size=st.sampled_from([1, 2, 4]),
    window=st.sampled_from([3, 8, 64]),
    spare_blocks=st.integers(0, 12),
    max_model_len=st.sampled_from([None, 24]),
)
def test_random_overlapped_workloads_match_the_reference(
    seed, block_size, window, spare_blocks, max_model_len
):
    """Random arrivals, aborts, EOS and pool sizes under overlapped scheduling: every request not
    aborted ends with the reference output, and the pool ends empty."""
    rng = random.Random(seed)
    prompts = {
        f"r{i}": [rng.randrange(37) for _ in range(rng.randrange(1, 10))]
        for i in range(rng.randrange(2, 8))
    }
    budget = 16
    params = {request_id: {"max_tokens": rng.randrange(1, 14)} for request_id in prompts}
    # NOTE: the pool holds the longest request on its own (as in test_scheduler.py's random
    # workloads): a request that outgrows the whole pool ends with LENGTH
    # (Scheduler._finish_outgrown), short of the reference (seed 129, block size 1, window 64).
    longest = max(len(p) + params[r]["max_tokens"] for r, p in prompts.items())
    probe = KVCacheManager.from_layout(
        KVCacheLayout.from_layer_windows([window, None]), 2, block_size=block_size
    )
    scheduler, runner = make(
        max(40, probe.num_blocks_needed(longest, budget) + 1) + spare_blocks,
        window=window,
        block_size=block_size,
        budget=budget,
        max_model_len=max_model_len,
    )
    truth = {rid: expected(p, scheduler, window, **params[rid]) for rid, p in prompts.items()}
    pending, aborted = list(prompts), set()

    def before_step(s: Scheduler) -> None:
        if pending and rng.random() < 0.3:
            request_id = pending.pop(0)
            add(s, request_id, prompts[request_id], **params[request_id])
        if rng.random() < 0.04 and s.requests:
            victim = rng.choice(sorted(s.requests))
            s.abort(victim)
            aborted.add(victim)

    outputs: dict[str, list[int]] = {}
    num_overlapped = 0
    while pending or scheduler.has_unfinished_requests():
        while pending and not scheduler.has_unfinished_requests():
            before_step(scheduler)
        driver = run_overlapped(scheduler, runner, before_step)
        num_overlapped += driver.num_overlapped
        for request_id, tokens in driver.outputs.items():
            outputs.setdefault(request_id, []).extend(tokens)
    for request_id in prompts:
        if request_id not in aborted:
            assert outputs.get(request_id) == truth[request_id], request_id
    assert_pool_empty(scheduler)
    event(f"overlapped: {num_overlapped > 0}")
    event(f"EOS: {any(EOS in t for t in truth.values())}")
