"""When requests are sent: fixed concurrency, or arrivals from a gamma process (Poisson when
burstiness is 1) optionally capped by a concurrency limit, for a number of requests or a duration.

The unit of scheduling is a conversation: its turns go one after another on the same slot, each
carrying the previous answers. A single-shot workload is conversations of one turn, so a slot is
one in-flight request, as `--max-concurrency` in vLLM. Warm-up requests go first and are not
counted. The run's duration is from the first scheduled send to the last request done.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx

from gossamer.bench.client import ClientConfig, RequestRecord, send_request
from gossamer.bench.errors import BenchConfigError
from gossamer.bench.workloads import Conversation, take_requests


@dataclass(frozen=True)
class LoadConfig:
    concurrency: int | None = 1  # conversations in flight at once; None = no limit
    request_rate: float = math.inf  # conversation arrivals per second
    burstiness: float = 1.0  # gamma shape: 1 = Poisson, < 1 burstier, > 1 more regular
    num_requests: int | None = 100  # stop after this many requests ...
    duration_s: float | None = None  # ... or stop sending new ones after this many seconds
    num_warmup: int = 1
    seed: int = 0
    show_progress: bool = True

    def validate(self) -> None:
        if (self.num_requests is None) == (self.duration_s is None):
            raise BenchConfigError("give exactly one of --num-prompts and --duration")
        if self.num_requests is not None and self.num_requests < 1:
            raise BenchConfigError("--num-prompts must be at least 1")
        if self.duration_s is not None and self.duration_s <= 0:
            raise BenchConfigError("--duration must be positive")
        if self.concurrency is not None and self.concurrency < 1:
            raise BenchConfigError("--concurrency must be at least 1")
        if self.request_rate <= 0 or self.burstiness <= 0:
            raise BenchConfigError("--request-rate and --burstiness must be positive")
        if math.isinf(self.request_rate) and self.concurrency is None:
            raise BenchConfigError("set --concurrency or --request-rate (or both)")


@dataclass
class RunOutcome:
    records: list[RequestRecord]
    duration_s: float
    warmup_records: list[RequestRecord]


def arrival_gaps(rate: float, burstiness: float, seed: int) -> Iterator[float]:
    """Seconds between arrivals: gamma(shape=burstiness, mean=1/rate); all 0 for rate inf."""
    rng = random.Random(seed)
    while True:
        yield 0.0 if math.isinf(rate) else rng.gammavariate(burstiness, 1.0 / (rate * burstiness))


async def run_load(
    client: ClientConfig,
    load: LoadConfig,
    stream: Iterator[Conversation],
    warmup_stream: Iterator[Conversation],
) -> RunOutcome:
    """Run warm-up then the measured load; every request ends up as one record."""
    load.validate()
    limits = httpx.Limits(max_connections=load.concurrency, max_keepalive_connections=None)
    timeout = httpx.Timeout(client.timeout_s)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as http:
        warmup = await _warm_up(http, client, load, warmup_stream)
        runner = _Runner(http, client, load)
        records, duration_s = await runner.run(stream)
    return RunOutcome(records, duration_s, warmup)


async def _warm_up(http, client, load, warmup_stream) -> list[RequestRecord]:
    if load.num_warmup <= 0:
        return []
    warm_load = LoadConfig(
        concurrency=min(load.concurrency or load.num_warmup, load.num_warmup),
        num_requests=load.num_warmup,
        show_progress=False,
    )
    records, _ = await _Runner(http, client, warm_load).run(warmup_stream)
    return records


class _Runner:
    def __init__(self, http: httpx.AsyncClient, client: ClientConfig, load: LoadConfig) -> None:
        self.http, self.client, self.load = http, client, load
        self.slots = asyncio.Semaphore(load.concurrency) if load.concurrency else None
        self.records: list[RequestRecord] = []
        self.next_request_id = 0
        self.progress = None

    async def run(self, stream: Iterator[Conversation]) -> tuple[list[RequestRecord], float]:
        if self.load.num_requests is not None:
            stream = iter(take_requests(stream, self.load.num_requests))
        self.progress = _progress_bar(self.load)
        self.origin = time.perf_counter()
        try:
            tasks = await self._dispatch(stream)
            await asyncio.gather(*tasks)
        finally:
            self.progress.close()
        duration_s = time.perf_counter() - self.origin
        return sorted(self.records, key=lambda r: r.request_id), duration_s

    def _elapsed(self) -> float:
        return time.perf_counter() - self.origin

    def _time_is_up(self) -> bool:
        return self.load.duration_s is not None and self._elapsed() >= self.load.duration_s

    async def _dispatch(self, stream: Iterator[Conversation]) -> list[asyncio.Task]:
        gaps = arrival_gaps(self.load.request_rate, self.load.burstiness, self.load.seed)
        arrival = 0.0
        tasks = []
        for conversation in stream:
            arrival += next(gaps)
            await asyncio.sleep(max(0.0, arrival - self._elapsed()))
            if self.slots is not None:
                await self.slots.acquire()
            if self._time_is_up():
                self._release()
                break
            scheduled = arrival if not math.isinf(self.load.request_rate) else self._elapsed()
            tasks.append(asyncio.create_task(self._converse(conversation, scheduled)))
        return tasks

    def _release(self) -> None:
        if self.slots is not None:
            self.slots.release()

    async def _converse(self, conversation: Conversation, scheduled: float) -> None:
        """Run the turns in order; after a failed turn the rest are recorded as skipped."""
        try:
            history = _system_messages(conversation)
            estimate = conversation.system_tokens
            failed = False
            for turn_index, turn in enumerate(conversation.turns):
                history.append({"role": "user", "content": turn.text})
                estimate += turn.num_tokens
                record = self._new_record(conversation, turn_index, turn, estimate, scheduled)
                if failed:
                    record.fail("Skipped", "an earlier turn of this conversation failed")
                else:
                    await send_request(self.http, self.client, history, record, self.origin)
                    failed = not record.success
                history.append({"role": "assistant", "content": record.content_text})
                estimate += _answer_tokens(record)
                scheduled = self._elapsed()  # the next turn is due as soon as this one ends
                self.progress.update(1)
        finally:
            self._release()

    def _new_record(self, conversation, turn_index, turn, estimate, scheduled) -> RequestRecord:
        record = RequestRecord(
            request_id=self.next_request_id,
            conversation_id=conversation.conversation_id,
            turn=turn_index,
            max_output_tokens=turn.max_output_tokens,
            prompt_tokens_estimate=estimate,
            scheduled_time=scheduled,
        )
        self.next_request_id += 1
        self.records.append(record)
        return record


def _answer_tokens(record: RequestRecord) -> int:
    """Tokens of the answer that goes back into the history (content only: reasoning of past
    turns is not sent again)."""
    if record.output_tokens is None:  # no usage: about one token per streamed event
        return record.num_content_events
    return max(0, record.output_tokens - (record.reasoning_tokens or 0))


def _system_messages(conversation: Conversation) -> list[dict[str, str]]:
    if conversation.system_prompt is None:
        return []
    return [{"role": "system", "content": conversation.system_prompt}]


def _progress_bar(load: LoadConfig):
    if not load.show_progress:
        return _NoProgress()
    from tqdm import tqdm

    label = f"c={load.concurrency or 'inf'} rate={load.request_rate:g}"
    return tqdm(total=load.num_requests, desc=label, unit="req", dynamic_ncols=True)


class _NoProgress:
    def update(self, count: int) -> None:
        pass

    def close(self) -> None:
        pass
