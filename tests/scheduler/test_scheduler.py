"""Scheduler behaviour, checked end to end through a fake model that reads the paged KV cache."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gossamer.cache import KVCacheLayout, KVCacheManager
from gossamer.scheduler import (
    DuplicateRequestError,
    FinishReason,
    Request,
    RequestStatus,
    RequestTooLargeError,
    Scheduler,
    SchedulerOutput,
)
from tests.scheduler.fake_model import FakeRunner, Params, next_token, reference_generate

EOS = 5


def make(
    num_blocks: int = 200,
    *,
    window: int = 8,
    block_size: int = 4,
    budget: int = 32,
    max_num_seqs: int = 16,
    max_model_len: int | None = None,
    prefix_caching: bool = True,
) -> tuple[Scheduler, FakeRunner]:
    layout = KVCacheLayout.from_layer_windows([window, None])
    manager = KVCacheManager.from_layout(
        layout, num_blocks, block_size=block_size, enable_prefix_caching=prefix_caching
    )
    scheduler = Scheduler(
        manager,
        max_num_batched_tokens=budget,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        eos_token_ids=[EOS],
    )
    return scheduler, FakeRunner(manager, window)


def check_step(scheduler: Scheduler, output: SchedulerOutput) -> None:
    scheduled = output.scheduled_requests
    assert output.num_scheduled_tokens == sum(s.num_new_tokens for s in scheduled)
    assert output.num_scheduled_tokens <= scheduler.max_num_batched_tokens
    assert len(scheduled) <= scheduler.max_num_seqs
    assert len({s.request_id for s in scheduled}) == len(scheduled)
    for index, s in enumerate(scheduled):
        assert s.num_new_tokens >= 1 and len(s.token_ids) == s.num_new_tokens
        if index < output.num_decode_requests:
            assert s.do_sample and s.num_new_tokens == s.num_draft_tokens + 1 and not s.is_new
    scheduler.kv_cache_manager.pool.check_invariants()


def drive(
    scheduler: Scheduler,
    runner: FakeRunner,
    *,
    max_steps: int = 3000,
    before_step=None,
) -> tuple[dict[str, list[int]], dict[str, FinishReason], list[SchedulerOutput]]:
    outputs: dict[str, list[int]] = {}
    reasons: dict[str, FinishReason] = {}
    history = []
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests():
            break
        if before_step is not None:
            before_step(scheduler)
        output = scheduler.schedule()
        check_step(scheduler, output)
        history.append(output)
        for update in scheduler.update(output, runner.execute(output)):
            outputs.setdefault(update.request_id, []).extend(update.new_token_ids)
            if update.finished:
                reasons[update.request_id] = update.finish_reason
    else:
        pytest.fail(f"requests still unfinished after {max_steps} steps")
    return outputs, reasons, history


def add(scheduler: Scheduler, request_id: str, prompt: list[int], **params) -> Request:
    request = Request(request_id, prompt, Params(**params))
    scheduler.add_request(request)
    return request


def expected(prompt: list[int], scheduler: Scheduler, window: int = 8, **params) -> list[int]:
    return reference_generate(
        prompt, Params(**params), window, frozenset([EOS]), scheduler.max_model_len
    )


def assert_pool_empty(scheduler: Scheduler) -> None:
    manager = scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.pool.num_usable_blocks
    assert not any(manager.pool.ref_counts)


def test_decodes_first_then_chunked_prefill_within_budget():
    scheduler, runner = make(budget=32)
    prompts = {f"short{i}": [10 + i] * 5 for i in range(4)}
    for request_id, prompt in prompts.items():
        add(scheduler, request_id, prompt, max_tokens=30, ignore_eos=True)
    first = scheduler.schedule()
    assert [s.num_new_tokens for s in first.scheduled_requests] == [5] * 4
    scheduler.update(first, runner.execute(first))
    long_prompt = [(7 * i) % 31 for i in range(100)]
    add(scheduler, "long", long_prompt, max_tokens=3, ignore_eos=True)
    chunks = []
    while not chunks or not chunks[-1].do_sample:
        output = scheduler.schedule()
        check_step(scheduler, output)
        assert output.num_decode_requests == 4
        assert [s.request_id for s in output.scheduled_requests[:4]] == list(prompts)
        assert all(s.num_new_tokens == 1 for s in output.scheduled_requests[:4])
        (chunk,) = output.scheduled_requests[4:]
        chunks.append(chunk)
        scheduler.update(output, runner.execute(output))
    assert [c.num_new_tokens for c in chunks] == [28, 28, 28, 16]
    assert [c.start_position for c in chunks] == [0, 28, 56, 84]
    assert [c.do_sample for c in chunks] == [False, False, False, True]
    outputs, _, _ = drive(scheduler, runner)
    assert scheduler.get_request("long") is None
    assert outputs["long"][-2:] == expected(long_prompt, scheduler, max_tokens=3)[-2:]


def test_outputs_match_reference_with_chunking_prefix_hits_and_sliding_window():
    scheduler, runner = make(budget=16, window=8)
    shared = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6]
    prompts = {f"r{i}": shared + [i] * (i + 1) for i in range(6)}
    for request_id, prompt in prompts.items():
        add(scheduler, request_id, prompt, max_tokens=40)
    outputs, reasons, _ = drive(scheduler, runner)
    for request_id, prompt in prompts.items():
        assert outputs[request_id] == expected(prompt, scheduler, max_tokens=40)
        stopped = outputs[request_id][-1] == EOS
        assert reasons[request_id] == (FinishReason.STOP if stopped else FinishReason.LENGTH)
    assert scheduler.kv_cache_manager.prefix_cache_stats.num_hit_tokens > 0
    assert_pool_empty(scheduler)


def test_preemption_under_a_tiny_pool_finishes_everything():
    # 11 usable blocks of 4 tokens: two requests of 20+ tokens cannot run side by side.
    scheduler, runner = make(num_blocks=12, budget=12, window=8)
    rng = random.Random(0)
    prompts = {f"r{i}": [rng.randrange(30) for _ in range(rng.randrange(3, 12))] for i in range(8)}
    for request_id, prompt in prompts.items():
        add(scheduler, request_id, prompt, max_tokens=12, ignore_eos=True)
    outputs, reasons, history = drive(scheduler, runner)
    assert sum(len(o.preempted_request_ids) for o in history) > 0
    for request_id, prompt in prompts.items():
        assert outputs[request_id] == expected(prompt, scheduler, max_tokens=12, ignore_eos=True)
        assert reasons[request_id] is FinishReason.LENGTH
    assert_pool_empty(scheduler)


def test_preempts_the_most_recent_arrival_and_requeues_it_first():
    scheduler, runner = make(num_blocks=12, budget=64, window=64, max_num_seqs=2)
    # Each holds 2 + 2 blocks at first; the pool has 11 usable blocks.
    add(scheduler, "old", [1] * 8, max_tokens=40, ignore_eos=True)
    add(scheduler, "new", [2] * 8, max_tokens=40, ignore_eos=True)
    add(scheduler, "queued", [3] * 4, max_tokens=4, ignore_eos=True)
    while True:
        output = scheduler.schedule()
        if output.preempted_request_ids:
            break
        scheduler.update(output, runner.execute(output))
    assert output.preempted_request_ids == ("new",)
    assert [s.request_id for s in output.scheduled_requests] == ["old"]
    assert [r.request_id for r in scheduler.waiting] == ["new", "queued"]
    new = scheduler.get_request("new")
    assert new.status is RequestStatus.PREEMPTED and new.num_computed_tokens == 0


def test_abort_frees_blocks_of_running_and_waiting_requests():
    scheduler, runner = make(budget=64, max_num_seqs=1)
    add(scheduler, "running", [1] * 30, max_tokens=50)
    add(scheduler, "waiting", [2] * 30, max_tokens=50)
    output = scheduler.schedule()
    scheduler.update(output, runner.execute(output))
    free_before = scheduler.kv_cache_manager.num_free_blocks
    assert scheduler.abort("running")
    assert scheduler.kv_cache_manager.num_free_blocks > free_before
    assert scheduler.abort("waiting") and not scheduler.abort("waiting")
    assert_pool_empty(scheduler)
    assert scheduler.schedule().aborted_request_ids == ("running", "waiting")
    assert not scheduler.has_unfinished_requests()


def test_abort_between_schedule_and_update_is_ignored_by_update():
    scheduler, runner = make()
    add(scheduler, "a", [1] * 10)
    add(scheduler, "b", [2] * 10)
    output = scheduler.schedule()
    sampled = runner.execute(output)
    scheduler.abort("a")
    updates = scheduler.update(output, sampled)
    assert [u.request_id for u in updates] == ["b"]


def test_finish_for_stop_strings_frees_and_reports():
    scheduler, runner = make()
    add(scheduler, "a", [1] * 10, max_tokens=50)
    output = scheduler.schedule()
    scheduler.update(output, runner.execute(output))
    assert scheduler.finish("a", FinishReason.STOP)
    assert_pool_empty(scheduler)
    assert scheduler.schedule().finished_request_ids == ("a",)


def test_requests_that_can_never_fit_fail_with_a_typed_error():
    scheduler, runner = make(num_blocks=8, budget=8, max_model_len=40)
    with pytest.raises(RequestTooLargeError, match="max_model_len|context"):
        add(scheduler, "long", [1] * 40)
    with pytest.raises(RequestTooLargeError, match="KV cache"):
        add(scheduler, "big", [1] * (scheduler.max_request_tokens + 1))
    add(scheduler, "ok", [1] * 8)
    with pytest.raises(DuplicateRequestError):
        add(scheduler, "ok", [1] * 8)
    # A request that outgrows the whole cache while decoding ends with "length".
    scheduler.abort("ok")
    prompt = [1] * scheduler.max_request_tokens
    add(scheduler, "grows", prompt, max_tokens=100, ignore_eos=True)
    outputs, reasons, _ = drive(scheduler, runner, max_steps=200)
    assert reasons["grows"] is FinishReason.LENGTH
    assert 1 <= len(outputs["grows"]) < 100
    assert (
        outputs["grows"]
        == expected(prompt, scheduler, ignore_eos=True, max_tokens=100)[: len(outputs["grows"])]
    )
    assert_pool_empty(scheduler)


def test_a_resumed_request_that_outgrew_the_cache_ends_instead_of_waiting_forever():
    scheduler, runner = make(num_blocks=10, budget=64, window=64)
    request = add(scheduler, "a", [1] * 8, max_tokens=100, ignore_eos=True)
    # As if it had grown while decoding and then been preempted: more tokens than fit.
    request.output_token_ids.extend([2] * 60)
    request.all_token_ids.extend([2] * 60)
    output = scheduler.schedule()
    assert output.is_empty and output.finished_request_ids == ("a",)
    (update,) = scheduler.update(output, {})
    assert update.finish_reason is FinishReason.LENGTH
    assert not scheduler.has_unfinished_requests()
    assert_pool_empty(scheduler)


def test_stop_conditions():
    scheduler, runner = make(max_model_len=30)
    prompts = {
        "eos": ([1, 2, 3], {"max_tokens": None}),
        "ignore": ([1, 2, 3], {"max_tokens": 9, "ignore_eos": True}),
        "min": ([1, 2, 3], {"max_tokens": 9, "min_tokens": 4}),
        "stop_id": ([4, 4], {"max_tokens": 20, "stop_token_ids": (11, 30)}),
        "ctx": ([6] * 20, {"max_tokens": None, "ignore_eos": True}),
    }
    for request_id, (prompt, params) in prompts.items():
        add(scheduler, request_id, prompt, **params)
    outputs, reasons, _ = drive(scheduler, runner)
    for request_id, (prompt, params) in prompts.items():
        assert outputs[request_id] == expected(prompt, scheduler, **params), request_id
    assert len(outputs["ctx"]) == 10 and reasons["ctx"] is FinishReason.LENGTH
    assert len(outputs["ignore"]) == 9


def test_speculative_drafts_are_verified_and_rolled_back():
    scheduler, runner = make(budget=64, window=8)
    prompt = [2, 7, 1, 8, 2, 8]
    request = add(scheduler, "a", prompt, max_tokens=30, ignore_eos=True)
    truth = expected(prompt, scheduler, max_tokens=30, ignore_eos=True)
    rng = random.Random(1)
    seen_rollback = False

    def propose(s: Scheduler) -> None:
        nonlocal seen_rollback
        if request.status is not RequestStatus.RUNNING or request.num_computed_tokens == 0:
            return
        done = len(request.output_token_ids)
        drafts = truth[done : done + 5]
        if rng.random() < 0.6 and drafts:
            cut = rng.randrange(len(drafts))
            drafts = drafts[:cut] + [(drafts[cut] + 1) % 37]
            seen_rollback = True
        s.set_draft_tokens("a", drafts)

    outputs, _, history = drive(scheduler, runner, before_step=propose)
    assert outputs["a"] == truth
    assert seen_rollback and any(s.num_draft_tokens for o in history for s in o.scheduled_requests)
    assert len(history) < 25  # accepted drafts saved steps
    assert_pool_empty(scheduler)


def test_rollback_lowers_num_computed_tokens_and_releases_blocks():
    scheduler, runner = make(budget=64, window=64, block_size=4)
    request = add(scheduler, "a", [1, 2, 3], max_tokens=30, ignore_eos=True)
    output = scheduler.schedule()
    scheduler.update(output, runner.execute(output))  # 4 tokens, 3 computed
    scheduler.set_draft_tokens("a", [9] * 8)
    output = scheduler.schedule()
    (scheduled,) = output.scheduled_requests
    assert (scheduled.start_position, scheduled.num_new_tokens) == (3, 9)
    assert scheduled.num_draft_tokens == 8 and scheduled.token_ids[1:] == [9] * 8
    held = [len(t) for t in scheduler.kv_cache_manager.block_tables("a")]
    assert held == [3, 3]  # positions 0..11
    updates = scheduler.update(output, {"a": [9, 9, 0]})  # two drafts accepted, then a fix
    assert updates[0].new_token_ids == [9, 9, 0]
    assert request.num_computed_tokens == 3 + 1 + 2
    assert [len(t) for t in scheduler.kv_cache_manager.block_tables("a")] == [2, 2]
    with pytest.raises(ValueError, match="at most drafts"):
        scheduler.set_draft_tokens("a", [1])
        output = scheduler.schedule()
        scheduler.update(output, {"a": [1, 2, 3]})


def test_fork_shares_the_prompt_blocks():
    scheduler, runner = make(budget=64, window=8)
    prompt = list(range(20, 43))
    add(scheduler, "parent", prompt, max_tokens=6, ignore_eos=True)
    output = scheduler.schedule()
    (first,) = scheduler.update(output, runner.execute(output))
    free_before = scheduler.kv_cache_manager.num_free_blocks
    shared = scheduler.fork("parent", Request("child", list(prompt), Params(max_tokens=6)))
    assert shared == 20  # 22 computed prompt positions, rounded down to blocks
    assert scheduler.kv_cache_manager.num_free_blocks == free_before  # nothing copied
    # A parent that is gone (or a full batch) queues the child like a new request.
    assert scheduler.fork("nobody", Request("orphan", list(prompt), Params(max_tokens=6))) == 0
    assert scheduler.get_request("orphan").status is RequestStatus.WAITING
    outputs, _, _ = drive(scheduler, runner)
    assert outputs["orphan"] == outputs["child"]
    assert (
        outputs["child"]
        == first.new_token_ids + outputs["parent"]
        == expected(prompt, scheduler, max_tokens=6, ignore_eos=True)
    )
    assert_pool_empty(scheduler)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**16),
    block_size=st.sampled_from([1, 2, 4, 8]),
    window=st.integers(2, 12),
    budget=st.integers(4, 40),
    max_num_seqs=st.integers(1, 6),
    spare_blocks=st.integers(0, 8),
    use_drafts=st.booleans(),
    prefix_caching=st.booleans(),
)
def test_random_workloads_match_the_reference(
    seed, block_size, window, budget, max_num_seqs, spare_blocks, use_drafts, prefix_caching
):
    """Random arrivals, aborts, drafts and pool sizes: every request that was not aborted ends
    with exactly the reference output, and the pool ends empty."""
    rng = random.Random(seed)
    max_tokens = 10
    base = [rng.randrange(37) for _ in range(20)]
    prompts = {
        f"r{i}": base[: rng.choice([0, 8, 16, 20])]
        + [rng.randrange(37) for _ in range(rng.randrange(1, 10))]
        for i in range(rng.randrange(3, 10))
    }
    longest = max(map(len, prompts.values())) + max_tokens
    layout = KVCacheLayout.from_layer_windows([window, None])
    probe = KVCacheManager.from_layout(layout, 2, block_size=block_size)
    num_blocks = probe.num_blocks_needed(longest, budget) + 1 + spare_blocks
    scheduler, runner = make(
        num_blocks,
        window=window,
        block_size=block_size,
        budget=budget,
        max_num_seqs=max_num_seqs,
        prefix_caching=prefix_caching,
    )
    params = {"max_tokens": max_tokens}
    truth = {rid: expected(p, scheduler, window, **params) for rid, p in prompts.items()}
    pending = list(prompts)
    aborted = set()

    def before_step(s: Scheduler) -> None:
        if pending and rng.random() < 0.3:
            request_id = pending.pop(0)
            add(s, request_id, prompts[request_id], **params)
        if rng.random() < 0.05 and s.requests:
            victim = rng.choice(sorted(s.requests))
            s.abort(victim)
            aborted.add(victim)
        for request in s.running:
            done = len(request.output_token_ids)
            if use_drafts and request.num_computed_tokens == request.num_tokens - 1:
                drafts = truth[request.request_id][done : done + rng.randrange(4)]
                if drafts and rng.random() < 0.5:
                    drafts[-1] = (drafts[-1] + 1) % 37
                s.set_draft_tokens(request.request_id, drafts)

    outputs: dict[str, list[int]] = {}
    num_preempted = num_drafts = num_steps = 0
    while pending or scheduler.has_unfinished_requests():
        while pending and not scheduler.has_unfinished_requests():
            before_step(scheduler)
        step_outputs, _, history = drive(scheduler, runner, before_step=before_step)
        num_preempted += sum(len(o.preempted_request_ids) for o in history)
        num_drafts += sum(s.num_draft_tokens for o in history for s in o.scheduled_requests)
        num_steps += len(history)
        for request_id, tokens in step_outputs.items():
            outputs.setdefault(request_id, []).extend(tokens)
    for request_id in prompts:
        if request_id not in aborted:
            assert outputs.get(request_id) == truth[request_id], request_id
    assert_pool_empty(scheduler)
    event(f"preempted: {num_preempted > 0}")
    event(f"drafts: {num_drafts > 0}")
    event(f"prefix hits: {scheduler.kv_cache_manager.prefix_cache_stats.num_hit_tokens > 0}")
    event(f"steps > 20: {num_steps > 20}")


def test_next_token_is_not_trivial():
    """Guard: the fake model must depend on both the prefix and the window."""
    assert next_token(10, [1, 2], 3) != next_token(11, [1, 2], 3)
    assert next_token(10, [1, 2], 3) != next_token(10, [1, 3], 3)
