"""What crosses the scheduler/runner boundary: `SchedulerOutput` in, `RequestUpdate` out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gossamer.scheduler.request import FinishReason


@dataclass(frozen=True, slots=True)
class ScheduledRequest:
    """One request's share of a step.

    The step feeds `token_ids` at positions `start_position .. start_position + num_new_tokens - 1`
    (`start_position` is the request's num_computed_tokens). The last `num_draft_tokens` of them
    are speculative drafts to verify. When `do_sample` is set the step reaches the end of the known
    tokens, and the runner must return the sampled tokens of this request: one token, or with drafts
    the accepted drafts plus one (1 .. num_draft_tokens + 1 tokens).

    Block tables, per cache group g: the runner keeps a copy and writes `new_block_ids[g]` into it
    from index `block_table_starts[g]` on (entries past the end of the new ones are gone, e.g. after
    a rollback). `is_new` (every start is 0) means the runner has nothing for this request yet:
    first scheduling, or resumed after a preemption. Slot of position p in group g:
    `table_g[p // block_size] * block_size + p % block_size`.
    """

    request_id: str
    token_ids: list[int]  # [num_new_tokens]
    start_position: int
    num_new_tokens: int
    num_draft_tokens: int
    do_sample: bool
    is_new: bool
    block_table_starts: tuple[int, ...]  # [num_groups]
    new_block_ids: tuple[tuple[int, ...], ...]  # [num_groups][varies]
    num_prompt_tokens: int
    sampling_params: Any  # the request's own object, not a copy

    @property
    def end_position(self) -> int:
        """Sequence length once the step ran: positions below it hold KV."""
        return self.start_position + self.num_new_tokens


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    """One step's batch. `scheduled_requests` lists decodes first (their prompt is done; they feed
    the last sampled token plus drafts), then prefill chunks: `num_decode_requests` tells where
    the prefills start.

    The runner drops its state for every id in `finished_request_ids`, `aborted_request_ids` and
    `preempted_request_ids` before handling the batch (a finished id may come back as a new request
    later only if the client reuses it).
    """

    step: int
    scheduled_requests: tuple[ScheduledRequest, ...]
    num_decode_requests: int
    num_scheduled_tokens: int
    preempted_request_ids: tuple[str, ...] = ()
    finished_request_ids: tuple[str, ...] = ()
    aborted_request_ids: tuple[str, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not self.scheduled_requests


@dataclass(frozen=True, slots=True)
class RequestUpdate:
    """What one step did to one request: tokens appended to its output, and whether it ended.

    `new_token_ids` stops at (and includes) a stop token; `stop_token_id` names it."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None
    stop_token_id: int | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
