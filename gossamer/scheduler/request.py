"""A generation request as the scheduler sees it."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # never scheduled yet
    RUNNING = "running"  # holds blocks; scheduled every step while the budget allows
    PREEMPTED = "preempted"  # back in the waiting queue without blocks; will recompute
    FINISHED = "finished"


class FinishReason(enum.StrEnum):
    """Why a request ended; the values are the OpenAI `finish_reason` strings."""

    STOP = "stop"  # EOS, a stop token id, or a stop string (via `Scheduler.finish`)
    LENGTH = "length"  # max_tokens, max_model_len, or the KV cache cannot hold it
    ABORT = "abort"  # the client went away or cancelled


@dataclass(slots=True, eq=False)
class Request:
    """One sequence to generate.

    `sampling_params` is opaque except for the attributes read once here (all optional):
    `max_tokens` (None: until max_model_len), `stop_token_ids`, `ignore_eos`, `min_tokens`.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: Any = None
    arrival_time: float = field(default_factory=time.monotonic)
    cache_salt: str | None = None
    output_token_ids: list[int] = field(default_factory=list)
    # prompt + output, kept in step so that slicing the next tokens to feed costs nothing extra.
    all_token_ids: list[int] = field(init=False)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    stop_token_id: int | None = None  # the stop token (EOS or stop_token_ids) that ended it
    # Draft tokens proposed for the next step (speculative decoding); consumed by that step.
    spec_token_ids: list[int] = field(default_factory=list)
    # Chained prefix-cache hashes of the full blocks, filled lazily by the KV cache manager.
    block_hashes: list[int] = field(default_factory=list)
    num_preemptions: int = 0
    num_cached_tokens: int = -1  # prefix-cache hit of the first scheduling (-1: not yet)
    max_tokens: int | None = field(init=False)
    min_tokens: int = field(init=False)
    stop_token_ids: frozenset[int] = field(init=False)
    ignore_eos: bool = field(init=False)
    arrival_order: int = field(init=False, default=0)  # set by the scheduler: FCFS tie-break

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError(f"request {self.request_id} has an empty prompt")
        self.all_token_ids = [*self.prompt_token_ids, *self.output_token_ids]
        params = self.sampling_params
        self.max_tokens = getattr(params, "max_tokens", None)
        self.min_tokens = getattr(params, "min_tokens", 0) or 0
        self.stop_token_ids = frozenset(getattr(params, "stop_token_ids", None) or ())
        self.ignore_eos = bool(getattr(params, "ignore_eos", False))

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED
