"""Requests, the per-step token budget, chunked prefill and preemption.

`Scheduler.schedule()` returns the `SchedulerOutput` that is the model runner's only input;
`Scheduler.update()` applies the sampled tokens and returns `RequestUpdate`s.
"""

from gossamer.scheduler.output import RequestUpdate, ScheduledRequest, SchedulerOutput
from gossamer.scheduler.request import FinishReason, Request, RequestStatus
from gossamer.scheduler.scheduler import (
    CONTINUATION_TOKEN_ID,
    DuplicateRequestError,
    RequestTooLargeError,
    Scheduler,
    SchedulerError,
)

__all__ = [
    "CONTINUATION_TOKEN_ID",
    "DuplicateRequestError",
    "FinishReason",
    "Request",
    "RequestStatus",
    "RequestTooLargeError",
    "RequestUpdate",
    "ScheduledRequest",
    "Scheduler",
    "SchedulerError",
    "SchedulerOutput",
]
