"""One engine request as the endpoints use it: start, iterate, time, and always clean up.

`EngineRun.start()` pulls the first output so that a bad request (the engine raises
`RequestError` before its first yield) becomes an HTTP error before any stream begins.
`EngineRun.close()` runs on every exit path: it closes the engine's generator and, unless the
request finished, awaits `engine.abort(request_id)`, so a client that went away frees its KV
blocks at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from gossamer.engine.outputs import RequestOutput
from gossamer.sampling_params import SamplingParams
from gossamer.server.engine_api import EngineClient
from gossamer.server.errors import EngineFailure, as_api_error
from gossamer.server.metrics import ServerMetrics


@dataclass
class _ChoiceTiming:
    first_token_at: float | None = None
    last_token_at: float | None = None
    num_tokens: int = 0


@dataclass
class RunUsage:
    """Token counts of one engine request (all its choices)."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: dict[int, int] = field(default_factory=dict)  # choice index -> count

    @property
    def completion_tokens(self) -> int:
        return sum(self.output_tokens.values())


class EngineRun:
    def __init__(
        self,
        engine: EngineClient,
        metrics: ServerMetrics,
        endpoint: str,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str,
        cache_salt: str | None = None,
        arrival: float | None = None,
    ) -> None:
        self.engine = engine
        self.metrics = metrics
        self.endpoint = endpoint
        self.prompt_ids = prompt_ids
        self.params = params
        self.request_id = request_id
        self.cache_salt = cache_salt
        self.arrival = time.perf_counter() if arrival is None else arrival
        self.usage = RunUsage(prompt_tokens=len(prompt_ids))
        self._generator: AsyncIterator[RequestOutput] | None = None
        self._first: RequestOutput | None = None
        self._finished_choices: set[int] = set()
        self._timings: dict[int, _ChoiceTiming] = {}
        self._closed = False

    @property
    def finished(self) -> bool:
        return len(self._finished_choices) >= self.params.n

    async def start(self) -> EngineRun:
        """Submit the request and wait for its first update; raises ApiError for a request the
        engine refuses."""
        self._generator = self.engine.generate(
            self.prompt_ids, self.params, self.request_id, self.cache_salt
        )
        try:
            self._first = await anext(self._generator)
        except StopAsyncIteration:
            self._first = None
        except Exception as error:
            await self.close()
            raise as_api_error(error) from error
        return self

    async def outputs(self) -> AsyncIterator[RequestOutput]:
        """Every update of every choice, in engine order (after `start`)."""
        assert self._generator is not None, "call start() first"
        if self._first is not None:
            first, self._first = self._first, None
            yield self._observe(first)
        async for output in self._generator:
            yield self._observe(output)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        generator, self._generator = self._generator, None
        aclose = getattr(generator, "aclose", None)
        if aclose is not None:
            try:
                await aclose()
            except Exception:  # an engine that fails while closing must not hide the abort
                pass
        if not self.finished:
            await self.engine.abort(self.request_id)

    # -- bookkeeping ----------------------------------------------------------------------------

    def _observe(self, output: RequestOutput) -> RequestOutput:
        if output.finish_reason == "error":
            raise EngineFailure(output.error or "the engine failed this request")
        now = time.perf_counter()
        self._record_usage(output)
        timing = self._timings.setdefault(output.index, _ChoiceTiming())
        if output.new_token_ids:
            if not self._timings_seen_token():
                self.metrics.ttft.labels(self.endpoint).observe(now - self.arrival)
            if timing.first_token_at is None:
                timing.first_token_at = now
            timing.last_token_at = now
            timing.num_tokens += len(output.new_token_ids)
        if output.finished:
            self._finish_choice(output.index, timing)
        return output

    def _timings_seen_token(self) -> bool:
        return any(timing.num_tokens for timing in self._timings.values())

    def _record_usage(self, output: RequestOutput) -> None:
        if output.num_prompt_tokens:
            self.usage.prompt_tokens = output.num_prompt_tokens
        self.usage.cached_tokens = max(self.usage.cached_tokens, output.num_cached_tokens)
        counted = self.usage.output_tokens.get(output.index, 0) + len(output.new_token_ids)
        self.usage.output_tokens[output.index] = max(counted, output.num_output_tokens)

    def _finish_choice(self, index: int, timing: _ChoiceTiming) -> None:
        if index in self._finished_choices:
            return
        self._finished_choices.add(index)
        if timing.num_tokens > 1 and timing.first_token_at is not None:
            decode_time = (timing.last_token_at or timing.first_token_at) - timing.first_token_at
            self.metrics.tpot.labels(self.endpoint).observe(decode_time / (timing.num_tokens - 1))
        if self.finished:
            self.metrics.e2e.labels(self.endpoint).observe(time.perf_counter() - self.arrival)
            self.metrics.prompt_tokens.labels(self.endpoint).inc(self.usage.prompt_tokens)
            self.metrics.generation_tokens.labels(self.endpoint).inc(self.usage.completion_tokens)


async def start_all(runs: Sequence[EngineRun]) -> Sequence[EngineRun]:
    """Start every run; if one is refused, close the others and raise its error."""
    try:
        for run in runs:
            await run.start()
    except BaseException:
        await close_all(runs)
        raise
    return runs


async def close_all(runs: Sequence[EngineRun]) -> None:
    for run in runs:
        await run.close()


async def merged_outputs(runs: Sequence[EngineRun]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(run position, output) from all runs as they come. The caller closes the runs."""
    if len(runs) == 1:
        async for output in runs[0].outputs():
            yield 0, output
        return
    queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(position: int, run: EngineRun) -> None:
        try:
            async for output in run.outputs():
                await queue.put((position, output))
            await queue.put((position, None))
        except Exception as error:
            await queue.put((position, error))

    tasks = [asyncio.create_task(pump(position, run)) for position, run in enumerate(runs)]
    try:
        remaining = len(tasks)
        while remaining:
            position, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield position, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
