"""The scheduler: which requests run in the next step, and how many tokens each.

One token budget per step (`max_num_batched_tokens`), no separate prefill and decode phases:

1. running requests whose prompt is done (decodes) get their last sampled token plus any draft
   tokens, oldest first;
2. running requests in the middle of their prompt get the next chunk, as large as the budget left;
3. waiting requests are admitted first come, first served while the budget, `max_num_seqs` and the
   KV cache allow, each with the longest prefix the prefix cache holds. A prompt larger than the
   budget left is chunked. The queue never skips its head (no starvation of long prompts).

When a running request needs a block and the pool has none, the most recently arrived running
request is preempted: its blocks go back to the pool (the full ones stay in the prefix cache), it
returns to the front of the waiting queue, and it recomputes prompt + output when admitted again.
No waiting request is admitted in a step that preempted, which stops admit/preempt thrashing.
A request that cannot grow even when it runs alone ends with finish reason "length"; a prompt that
can never fit in the pool is refused by `add_request` with `RequestTooLargeError`.

`update(output, sampled)` applies a step: advances num_computed_tokens, rolls back rejected draft
tokens (num_computed_tokens goes down and blocks past it are released), appends sampled tokens,
checks EOS / stop token ids / max_tokens / max_model_len, caches newly full blocks and frees
finished requests. Text stop strings are detected elsewhere and reported with `finish()`.

`schedule_continuation(previous)` (overlapped scheduling, gossamer/engine/overlap.py) schedules the
decode step after `previous` before `previous`'s tokens are applied, or declines (None) whenever
the rules above might choose differently (waiting requests, preemption, the end of the context).

Costs: every step is O(running requests) plus O(new blocks); nothing runs per token except the
stop check of the sampled tokens.

NOTE: `abort()` and `finish()` free blocks at once, so call them between steps (after `update`,
before `schedule`), never while the runner is still writing a step's KV.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gossamer.cache.manager import KVCacheManager
from gossamer.scheduler.output import RequestUpdate, ScheduledRequest, SchedulerOutput
from gossamer.scheduler.request import FinishReason, Request, RequestStatus

# What a continuation step (`schedule_continuation`) feeds in place of the previous step's sampled
# token, which only the device holds; the engine has the runner overwrite it there.
CONTINUATION_TOKEN_ID = 0


class SchedulerError(Exception):
    """Base class of the errors a caller of the scheduler can cause."""


class RequestTooLargeError(SchedulerError, ValueError):
    """The prompt can never be computed: longer than max_model_len or than the KV cache holds."""


class DuplicateRequestError(SchedulerError, ValueError):
    """A live request already has this id."""


@dataclass(slots=True)
class _Step:
    """Bookkeeping of one `schedule()` call."""

    budget: int
    # request id -> (request, num_new_tokens, is_decode), decodes first, in batch order.
    scheduled: dict[str, tuple[Request, int, bool]] = field(default_factory=dict)
    preempted: list[str] = field(default_factory=list)


class Scheduler:
    """FCFS continuous batching with chunked prefill, prefix caching and preemption."""

    def __init__(
        self,
        kv_cache_manager: KVCacheManager,
        *,
        max_num_batched_tokens: int = 8192,
        max_num_seqs: int = 256,
        max_model_len: int | None = None,
        eos_token_ids: Iterable[int] = (),
    ) -> None:
        if max_num_batched_tokens < 1 or max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be >= 1")
        if max_model_len is not None and max_model_len < 2:
            raise ValueError("max_model_len must be >= 2 (a prompt token and an output token)")
        self.kv_cache_manager = kv_cache_manager
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.requests: dict[str, Request] = {}  # every live (waiting or running) request
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.max_request_tokens = self._largest_request_that_fits()
        self._arrivals = itertools.count()
        self._step = 0
        self._finished_ids: list[str] = []
        self._aborted_ids: list[str] = []
        self._pending_updates: list[RequestUpdate] = []

    # ---- queue management ------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        """Queue a new request. Raises RequestTooLargeError / DuplicateRequestError."""
        if request.request_id in self.requests:
            raise DuplicateRequestError(f"a request with id {request.request_id!r} is running")
        self._check_fits(request)
        request.arrival_order = next(self._arrivals)
        request.status = RequestStatus.WAITING
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def _check_fits(self, request: Request) -> None:
        num_tokens = request.num_tokens
        if self.max_model_len is not None and num_tokens >= self.max_model_len:
            raise RequestTooLargeError(
                f"the prompt has {num_tokens} tokens but the model's context is "
                f"{self.max_model_len} tokens, with room for at least one output token; "
                "shorten the prompt"
            )
        if num_tokens > self.max_request_tokens:
            needed = self.kv_cache_manager.num_blocks_needed(
                num_tokens, self.max_num_batched_tokens
            )
            raise RequestTooLargeError(
                f"the prompt has {num_tokens} tokens and needs {needed} KV cache blocks, but the "
                f"cache has {self.kv_cache_manager.pool.num_usable_blocks} (at most "
                f"{self.max_request_tokens} tokens per request); shorten the prompt or give the "
                "KV cache more memory"
            )

    def _largest_request_that_fits(self) -> int:
        """Most tokens one request can hold when it runs alone (binary search)."""
        manager = self.kv_cache_manager
        usable = manager.pool.num_usable_blocks
        low, high = 0, self.max_model_len if self.max_model_len is not None else 1 << 40
        while low < high:
            mid = (low + high + 1) // 2
            if manager.num_blocks_needed(mid, self.max_num_batched_tokens) <= usable:
                low = mid
            else:
                high = mid - 1
        return low

    def fork(self, parent_id: str, child: Request) -> int:
        """Start `child` (same prompt as `parent_id`) on the parent's computed full blocks,
        shared copy-free, for n > 1 sampling. Returns the number of shared tokens. With 0
        (parent not running, nothing to share, or `max_num_seqs` reached) the child is queued
        like `add_request`, where the prefix cache still finds the parent's cached blocks."""
        if child.request_id in self.requests:
            raise DuplicateRequestError(f"a request with id {child.request_id!r} is running")
        parent = self.requests.get(parent_id)
        if parent is None or parent.status is not RequestStatus.RUNNING:
            self.add_request(child)
            return 0
        num_tokens = min(parent.num_computed_tokens, child.num_tokens - 1)
        if parent.all_token_ids[:num_tokens] != child.all_token_ids[:num_tokens]:
            raise SchedulerError(f"{child.request_id!r} does not share {parent_id!r}'s prompt")
        shared = 0
        if len(self.running) < self.max_num_seqs:
            self._check_fits(child)
            shared = self.kv_cache_manager.fork(parent_id, child.request_id, num_tokens)
        if shared == 0:
            self.add_request(child)
            return 0
        child.arrival_order = next(self._arrivals)
        child.num_computed_tokens = child.num_cached_tokens = shared
        child.status = RequestStatus.RUNNING
        self.requests[child.request_id] = child
        self.running.append(child)
        return shared

    def set_draft_tokens(self, request_id: str, draft_token_ids: list[int]) -> None:
        """Draft tokens to verify in the request's next step (speculative decoding)."""
        self.requests[request_id].spec_token_ids = draft_token_ids

    def abort(self, request_id: str) -> bool:
        """End a waiting or running request now and free its blocks. False if unknown."""
        return self._end(request_id, FinishReason.ABORT, self._aborted_ids)

    def finish(self, request_id: str, reason: FinishReason = FinishReason.STOP) -> bool:
        """End a request for a reason found outside the scheduler (a text stop string)."""
        return self._end(request_id, reason, self._finished_ids)

    def _end(self, request_id: str, reason: FinishReason, report_to: list[str]) -> bool:
        request = self.requests.get(request_id)
        if request is None:
            return False
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        self._release(request, reason)
        report_to.append(request_id)
        return True

    def _release(self, request: Request, reason: FinishReason) -> None:
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        self.kv_cache_manager.cache_computed_blocks(request)
        self.kv_cache_manager.free(request.request_id)
        del self.requests[request.request_id]

    # ---- state -----------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_request(self, request_id: str) -> Request | None:
        return self.requests.get(request_id)

    # ---- one step --------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Choose the next batch (see the module doc for the rules)."""
        self._step += 1
        step = _Step(budget=self.max_num_batched_tokens)
        decodes, prefills = [], []
        for request in self.running:
            if len(request.all_token_ids) - request.num_computed_tokens == 1:
                decodes.append(request)
            else:
                prefills.append(request)
        for requests, is_decode in ((decodes, True), (prefills, False)):
            for request in requests:
                if step.budget == 0:
                    break
                if request.status is RequestStatus.RUNNING:  # not preempted earlier this step
                    self._schedule_running(request, step, is_decode)
        if not step.preempted:
            self._admit_waiting(step)
        return self._build_output(step)

    def _schedule_running(self, request: Request, step: _Step, is_decode: bool) -> None:
        start = request.num_computed_tokens
        num_new = len(request.all_token_ids) - start
        if is_decode and request.spec_token_ids:
            num_new += len(request.spec_token_ids)
        if self.max_model_len is not None and num_new > self.max_model_len - start:
            num_new = self.max_model_len - start  # positions, drafts included, stay in context
        if num_new > step.budget:
            num_new = step.budget
        allocate_slots = self.kv_cache_manager.allocate_slots
        while not allocate_slots(request, num_new):
            if is_decode and num_new > 1:
                num_new = 1  # drop the drafts before taking anyone's blocks
                continue
            victim = max(self.running, key=_arrival_order)
            if victim is request and len(self.running) == 1:
                self._finish_outgrown(request)
                return
            self._preempt(victim, step)
            if victim is request:
                return
        step.scheduled[request.request_id] = (request, num_new, is_decode)
        step.budget -= num_new

    def _finish_outgrown(self, request: Request) -> None:
        """Alone and still short of blocks: the request has outgrown the whole cache."""
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        self._release(request, FinishReason.LENGTH)
        self._finished_ids.append(request.request_id)
        self._pending_updates.append(RequestUpdate(request.request_id, [], FinishReason.LENGTH))

    def _preempt(self, request: Request, step: _Step) -> None:
        self.kv_cache_manager.free(request.request_id)
        self.running.remove(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.spec_token_ids = []
        self.waiting.appendleft(request)
        entry = step.scheduled.pop(request.request_id, None)
        if entry is not None:
            step.budget += entry[1]
        step.preempted.append(request.request_id)

    def _admit_waiting(self, step: _Step) -> None:
        manager = self.kv_cache_manager
        while self.waiting and step.budget > 0 and len(self.running) < self.max_num_seqs:
            # A new request needs at least one fresh block per group: skip the lookup if the
            # pool cannot even give that.
            if manager.num_free_blocks < manager.num_groups:
                return
            request = self.waiting[0]
            hit = manager.find_cached_prefix(request)
            num_new = min(request.num_tokens - hit.num_tokens, step.budget)
            if not manager.allocate_slots(request, num_new, hit):
                if self.running:
                    return  # wait for running requests to finish or be preempted
                # Nothing holds a block and the head still does not fit: a preempted request
                # that grew past what the cache can recompute. Waiting would loop forever.
                self.waiting.popleft()
                self._finish_outgrown(request)
                continue
            self.waiting.popleft()
            request.num_computed_tokens = hit.num_tokens
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = hit.num_tokens
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            step.scheduled[request.request_id] = (request, num_new, False)
            step.budget -= num_new

    def _build_output(self, step: _Step) -> SchedulerOutput:
        take_new_block_ids = self.kv_cache_manager.take_new_block_ids
        scheduled = []
        num_tokens = num_decodes = 0
        for request_id, (request, num_new, is_decode) in step.scheduled.items():
            start = request.num_computed_tokens
            tokens = request.all_token_ids
            num_pending = len(tokens) - start
            if num_new > num_pending:
                num_drafts = num_new - num_pending
                token_ids = tokens[start:] + request.spec_token_ids[:num_drafts]
            else:
                num_drafts = 0
                token_ids = tokens[start : start + num_new]
            block_table_start, new_block_ids = take_new_block_ids(request_id)
            scheduled.append(
                ScheduledRequest(
                    request_id,
                    token_ids,
                    start,
                    num_new,
                    num_drafts,
                    num_new >= num_pending,
                    block_table_start == 0,
                    block_table_start,
                    new_block_ids,
                    len(request.prompt_token_ids),
                    request.sampling_params,
                )
            )
            num_tokens += num_new
            num_decodes += is_decode
        return self._output(tuple(scheduled), num_decodes, num_tokens, tuple(step.preempted))

    def _output(
        self,
        scheduled: tuple[ScheduledRequest, ...],
        num_decodes: int,
        num_tokens: int,
        preempted: tuple[str, ...],
        continuation: bool = False,
    ) -> SchedulerOutput:
        """The step's output; it reports (once) the requests that ended since the last one."""
        output = SchedulerOutput(
            step=self._step,
            scheduled_requests=scheduled,
            num_decode_requests=num_decodes,
            num_scheduled_tokens=num_tokens,
            preempted_request_ids=preempted,
            finished_request_ids=tuple(self._finished_ids),
            aborted_request_ids=tuple(self._aborted_ids),
            continuation=continuation,
        )
        self._finished_ids.clear()
        self._aborted_ids.clear()
        return output

    def schedule_continuation(self, previous: SchedulerOutput) -> SchedulerOutput | None:
        """The step after `previous`, a plain decode step whose sampled tokens are not applied yet
        (overlapped scheduling, gossamer/engine/overlap.py): every request of `previous` still
        running is assumed to go on, and feeds one token at the position after the one `previous`
        fed. That token is not known on the host: the output carries CONTINUATION_TOKEN_ID in its
        place and the engine feeds the sampled token from the device.

        None when the ordinary `schedule()` must decide instead: a request waits, a running
        request was not in `previous` or was not a plain decode there, a position would leave the
        context, or the pool is short of a block (schedule() would preempt). A request that turns
        out to stop on its `previous` token computes one token too many: `update()` drops it, and
        the block taken for it is freed with the request's other blocks.

        NOTE: on None, requests before the one that lacked a block keep the block taken for their
        next position; they use it at their next step or free it when they end."""
        if self.waiting or not self.running:
            return None
        continuing = [item for item in previous.scheduled_requests if self._continues(item)]
        if len(continuing) != len(self.running):
            return None  # someone runs that `previous` did not hold, or did not decode
        allocate_slots = self.kv_cache_manager.allocate_slots
        for item in continuing:
            # the position `previous` fed (not yet counted as computed) and the next one
            if not allocate_slots(self.requests[item.request_id], 2):
                return None
        self._step += 1
        return self._build_continuation(continuing)

    def _continues(self, item: ScheduledRequest) -> bool:
        """Whether a request of the previous step can go on without the host seeing its token."""
        request = self.requests.get(item.request_id)
        return (
            request is not None
            and request.status is RequestStatus.RUNNING
            and request.num_computed_tokens == item.start_position  # its update is still due
            and item.num_new_tokens == 1
            and item.num_draft_tokens == 0
            and item.do_sample
            and (self.max_model_len is None or item.start_position + 1 < self.max_model_len)
        )

    def _build_continuation(self, continuing: list[ScheduledRequest]) -> SchedulerOutput:
        take_new_block_ids = self.kv_cache_manager.take_new_block_ids
        scheduled = []
        for item in continuing:
            block_table_start, new_block_ids = take_new_block_ids(item.request_id)
            scheduled.append(
                item._replace(
                    token_ids=[CONTINUATION_TOKEN_ID],
                    start_position=item.start_position + 1,
                    is_new=False,
                    block_table_start=block_table_start,
                    new_block_ids=new_block_ids,
                )
            )
        return self._output(tuple(scheduled), len(scheduled), len(scheduled), (), continuation=True)

    # ---- after the step --------------------------------------------------------------------

    def update(
        self, output: SchedulerOutput, sampled_token_ids: Mapping[str, list[int]]
    ) -> list[RequestUpdate]:
        """Apply a step's results. `sampled_token_ids[id]` is needed for every scheduled request
        with `do_sample`; with drafts it holds the accepted drafts plus one token. Returns one
        update per request that got tokens or finished (including finishes decided in
        `schedule()` because the cache was too small)."""
        updates, self._pending_updates = self._pending_updates, []
        any_finished = False
        requests = self.requests
        manager = self.kv_cache_manager
        for scheduled in output.scheduled_requests:
            request = requests.get(scheduled.request_id)
            if request is None or request.status is not RequestStatus.RUNNING:
                continue  # aborted or finished since schedule()
            num_computed = scheduled.start_position + scheduled.num_new_tokens
            if not scheduled.do_sample:
                request.num_computed_tokens = num_computed
                manager.cache_computed_blocks(request)
                continue
            new_token_ids = sampled_token_ids.get(scheduled.request_id)
            if scheduled.num_draft_tokens or not new_token_ids or len(new_token_ids) != 1:
                num_rejected = self._num_rejected(scheduled, new_token_ids)
                request.num_computed_tokens = num_computed - num_rejected
                if num_rejected:
                    manager.truncate(request.request_id, num_computed - num_rejected)
                new_token_ids, reason = self._append_tokens(request, new_token_ids)
            else:  # the common case: one token, no drafts
                request.num_computed_tokens = num_computed
                token = new_token_ids[0]
                request.output_token_ids.append(token)
                request.all_token_ids.append(token)
                reason = self._stop_reason(request, token)
            if request.spec_token_ids:
                request.spec_token_ids = []
            manager.cache_computed_blocks(request)
            if reason is not None:
                self._release(request, reason)
                self._finished_ids.append(request.request_id)
                any_finished = True
            updates.append(
                RequestUpdate(request.request_id, new_token_ids, reason, request.stop_token_id)
            )
        if any_finished:
            self.running = [r for r in self.running if r.status is RequestStatus.RUNNING]
        return updates

    @staticmethod
    def _num_rejected(scheduled: ScheduledRequest, new_token_ids: list[int] | None) -> int:
        if not new_token_ids:
            raise ValueError(f"no sampled token for {scheduled.request_id!r}, which asked for one")
        num_rejected = scheduled.num_draft_tokens + 1 - len(new_token_ids)
        if num_rejected < 0:
            raise ValueError(
                f"{len(new_token_ids)} tokens for {scheduled.request_id!r}, which had "
                f"{scheduled.num_draft_tokens} draft tokens (at most drafts + 1)"
            )
        return num_rejected

    def _append_tokens(
        self, request: Request, new_token_ids: list[int]
    ) -> tuple[list[int], FinishReason | None]:
        """Append tokens up to the first one that ends the request."""
        output, tokens = request.output_token_ids, request.all_token_ids
        for index, token in enumerate(new_token_ids):
            output.append(token)
            tokens.append(token)
            reason = self._stop_reason(request, token)
            if reason is not None:
                return new_token_ids[: index + 1], reason
        return new_token_ids, None

    def _stop_reason(self, request: Request, token: int) -> FinishReason | None:
        num_output = len(request.output_token_ids)
        if num_output >= request.min_tokens and (
            token in request.stop_token_ids
            or (not request.ignore_eos and token in self.eos_token_ids)
        ):
            request.stop_token_id = token
            return FinishReason.STOP
        if request.max_tokens is not None and num_output >= request.max_tokens:
            return FinishReason.LENGTH
        if self.max_model_len is not None and len(request.all_token_ids) >= self.max_model_len:
            return FinishReason.LENGTH
        return None


def _arrival_order(request: Request) -> int:
    return request.arrival_order
