"""What crosses the scheduler/runner boundary: `SchedulerOutput` in, `RequestUpdate` out.

The per-request records are NamedTuples: immutable and about three times cheaper to build than
frozen dataclasses, which matters at a few hundred of them per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from gossamer.scheduler.request import FinishReason


class ScheduledRequest(NamedTuple):
    """One request's share of a step.

    The step feeds `token_ids` at positions `start_position .. start_position + num_new_tokens - 1`
    (`start_position` is the request's num_computed_tokens before the step). The last
    `num_draft_tokens` of them are speculative drafts to verify. When `do_sample` is set the step
    reaches the end of the known tokens and the runner must return this request's sampled tokens:
    one token, or with drafts the accepted drafts plus one (1 .. num_draft_tokens + 1 tokens).

    Block tables: the runner keeps a copy per request and group; for every group g it writes
    `new_block_ids[g]` at index `block_table_start` (`row[start:start + len(new)] = new`). Only
    the first cdiv(end_position, block_size) entries are meaningful, and in a sliding group only
    those inside the window of a query. `is_new` means the runner holds nothing for this request
    (first scheduling, or resumed after a preemption): the tables come whole, start is 0.
    Slot of position p in group g: `table_g[p // block_size] * block_size + p % block_size`.
    """

    request_id: str
    token_ids: list[int]  # [num_new_tokens]
    start_position: int
    num_new_tokens: int
    num_draft_tokens: int
    do_sample: bool
    is_new: bool
    block_table_start: int
    new_block_ids: tuple[tuple[int, ...], ...]  # [num_groups][new entries]
    num_prompt_tokens: int
    sampling_params: Any  # the request's own object, not a copy

    @property
    def end_position(self) -> int:
        """Sequence length once the step ran: positions below it hold KV."""
        return self.start_position + self.num_new_tokens


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    """One step's batch. `scheduled_requests` lists the running decodes first (each feeds its one
    pending token plus drafts and samples), then prefill chunks of running requests, then newly
    admitted or resumed requests. The first `num_decode_requests` entries are the decodes; a later
    entry can also be a single sampled token (a prompt whose prefix cache hit left one token).

    The runner drops its state for every id in `finished_request_ids`, `aborted_request_ids` and
    `preempted_request_ids` before handling the batch (an id can come back later: a preempted
    request when it resumes, a finished id if a client reuses it).
    """

    step: int
    scheduled_requests: tuple[ScheduledRequest, ...]
    num_decode_requests: int
    num_scheduled_tokens: int
    preempted_request_ids: tuple[str, ...] = ()
    finished_request_ids: tuple[str, ...] = ()
    aborted_request_ids: tuple[str, ...] = ()
    # made by `schedule_continuation`: every request of it was in the step before, unchanged
    continuation: bool = False

    @property
    def is_empty(self) -> bool:
        return not self.scheduled_requests


class RequestUpdate(NamedTuple):
    """What one step did to one request: tokens appended to its output, and whether it ended.

    `new_token_ids` stops at (and includes) a stop token; `stop_token_id` names it."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None
    stop_token_id: int | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
