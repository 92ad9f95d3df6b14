"""One streamed request to an OpenAI-compatible endpoint, timed into a `RequestRecord`.

Timing follows `vllm bench serve` (see metrics.py for the definitions): the clock starts just
before the POST; a "token event" is a streamed event carrying generated text (reasoning or
content); TTFT is the first token event, ITL the gaps between token events, end-to-end latency
ends at the last token event (the trailing usage chunk and `[DONE]` do not count).

A request never raises: connection errors, HTTP errors, error events, streams cut midway or
ended without their terminator, and timeouts are stored in the record as `error_kind`/`error`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

ENDPOINT_PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "responses": "/v1/responses",
}
_ERROR_BODY_CHARS = 300


@dataclass(frozen=True)
class ClientConfig:
    base_url: str  # scheme://host:port[/prefix], without the trailing /v1
    endpoint: str  # a key of ENDPOINT_PATHS
    model: str
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 600.0
    ignore_eos: bool = False  # ask for exactly max tokens: ignore_eos + min_tokens
    temperature: float | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + ENDPOINT_PATHS[self.endpoint]


@dataclass
class RequestRecord:
    """Everything measured about one request. Times are in seconds; `scheduled_time` and
    `start_time` count from the start of the run, the others from `start_time`."""

    request_id: int
    conversation_id: int
    turn: int
    max_output_tokens: int
    prompt_tokens_estimate: int
    scheduled_time: float = 0.0  # when the arrival process released it
    start_time: float = 0.0  # when it was sent (after any client-side queueing)
    success: bool = False
    error_kind: str = ""
    error: str = ""
    http_status: int | None = None
    ttft: float | None = None  # first token event of any kind (reasoning or content)
    ttfct: float | None = None  # first content token event (after any reasoning)
    e2el: float | None = None  # last token event
    itl: list[float] = field(default_factory=list)  # gaps between token events
    num_content_events: int = 0
    num_reasoning_events: int = 0
    finish_reason: str | None = None
    input_tokens: int | None = None  # from usage, else None
    output_tokens: int | None = None  # from usage, else counted (see output_tokens_source)
    reasoning_tokens: int | None = None
    output_tokens_source: str = ""  # "usage", "tokenizer" or "events"
    reasoning_tokens_source: str = ""
    content_text: str = ""  # kept for multi-turn history; saved only with --save-text
    reasoning_text: str = ""

    def fail(self, kind: str, message: str) -> None:
        self.success, self.error_kind, self.error = False, kind, message

    def to_json(self, save_text: bool = False) -> dict[str, Any]:
        data = dict(self.__dict__)
        if not save_text:
            data.pop("content_text")
            data.pop("reasoning_text")
        return data


class _StreamError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def build_payload(config: ClientConfig, messages: list[dict[str, str]], max_tokens: int) -> dict:
    """The JSON body for `config.endpoint`; `messages` is the chat history ending with the user."""
    payload: dict[str, Any] = {"model": config.model, "stream": True}
    if config.endpoint == "chat":
        payload["messages"] = messages
        payload["max_completion_tokens"] = max_tokens
        payload["stream_options"] = {"include_usage": True}
    elif config.endpoint == "completions":
        # NOTE: a single user turn is sent verbatim so that its exact token length holds.
        payload["prompt"] = "\n\n".join(m["content"] for m in messages)
        payload["max_tokens"] = max_tokens
        payload["stream_options"] = {"include_usage": True}
    else:  # responses: usage arrives in response.completed, no stream_options
        system = [m["content"] for m in messages if m["role"] == "system"]
        if system:
            payload["instructions"] = "\n\n".join(system)
        payload["input"] = [m for m in messages if m["role"] != "system"]
        payload["max_output_tokens"] = max_tokens
    if config.ignore_eos:
        payload["ignore_eos"] = True
        payload["min_tokens"] = max_tokens
    if config.temperature is not None:
        payload["temperature"] = config.temperature
    payload.update(config.extra_body)
    return payload


async def send_request(
    http: httpx.AsyncClient,
    config: ClientConfig,
    messages: list[dict[str, str]],
    record: RequestRecord,
    run_origin: float,
) -> None:
    """Send one streamed request and fill `record` in place; never raises (except cancel)."""
    payload = build_payload(config, messages, record.max_output_tokens)
    stream = _StreamState(time.perf_counter())
    record.start_time = stream.start - run_origin
    try:
        async with asyncio.timeout(config.timeout_s):
            await _stream_into(http, config, payload, record, stream)
        stream.finish_into(record)
    except TimeoutError:
        record.fail("Timeout", f"no complete response within {config.timeout_s:g} s")
    except _StreamError as exc:
        record.fail(exc.kind, str(exc))
    except httpx.HTTPError as exc:
        record.fail(type(exc).__name__, str(exc) or type(exc).__name__)
    except Exception as exc:  # noqa: BLE001 - a malformed response must not end the run
        record.fail(type(exc).__name__, str(exc) or repr(exc))
    stream.copy_timings(record)


async def _stream_into(http, config, payload, record, stream) -> None:
    async with http.stream("POST", config.url, json=payload, headers=config.headers) as response:
        record.http_status = response.status_code
        if response.status_code != 200:
            body = (await response.aread()).decode("utf-8", "replace")
            raise _StreamError(
                f"HTTP {response.status_code}",
                f"HTTP {response.status_code}: {body[:_ERROR_BODY_CHARS]}",
            )
        # NOTE: read to the end even after the terminator: a response left half-read
        # cannot give its connection back to the pool, and a new connection (TCP, TLS)
        # would be charged to the next request's TTFT.
        async for event_type, data in iter_sse(response):
            if not stream.done:
                _on_event(config.endpoint, stream, event_type, data, time.perf_counter())
    if stream.done:
        return
    terminator = "response.completed" if config.endpoint == "responses" else "[DONE]"
    raise _StreamError("StreamIncomplete", f"the stream ended before {terminator}")


async def iter_sse(response: httpx.Response) -> AsyncIterator[tuple[str | None, str]]:
    """(event type, data) for each server-sent event; comments (pings) are skipped."""
    event_type: str | None = None
    data_lines: list[str] = []
    async for line in response.aiter_lines():
        if not line:
            if data_lines:
                yield event_type, "\n".join(data_lines)
            event_type, data_lines = None, []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data_lines.append(value)
        elif name == "event":
            event_type = value
    if data_lines:  # a last event without its blank line
        yield event_type, "\n".join(data_lines)


@dataclass
class _StreamState:
    start: float
    first_token: float | None = None
    first_content: float | None = None
    last_token: float | None = None
    itl: list[float] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    num_content_events: int = 0
    num_reasoning_events: int = 0
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    done: bool = False

    def on_text(self, now: float, content: str, reasoning: str) -> None:
        if not content and not reasoning:
            return  # role headers, empty deltas, finish-only chunks: not a token
        if self.last_token is None:
            self.first_token = now
        else:
            self.itl.append(now - self.last_token)
        self.last_token = now
        if content:
            self.first_content = self.first_content or now
            self.content.append(content)
            self.num_content_events += 1
        if reasoning:
            self.reasoning.append(reasoning)
            self.num_reasoning_events += 1

    def finish_into(self, record: RequestRecord) -> None:
        if self.first_token is None:
            raise _StreamError("NoTokens", "the stream finished without any generated text")
        record.success = True
        record.finish_reason = self.finish_reason
        record.content_text = "".join(self.content)
        record.reasoning_text = "".join(self.reasoning)
        _apply_usage(record, self.usage or {})

    def copy_timings(self, record: RequestRecord) -> None:
        """Timings are kept for failed requests too: they show where a stream broke."""
        since_start = lambda t: None if t is None else t - self.start  # noqa: E731
        record.ttft = since_start(self.first_token)
        record.ttfct = since_start(self.first_content)
        record.e2el = since_start(self.last_token)
        record.itl = self.itl
        record.num_content_events = self.num_content_events
        record.num_reasoning_events = self.num_reasoning_events


def _apply_usage(record: RequestRecord, usage: dict[str, Any]) -> None:
    # chat/completions name them prompt/completion tokens, responses input/output tokens
    record.input_tokens = usage.get("prompt_tokens", usage.get("input_tokens"))
    record.output_tokens = usage.get("completion_tokens", usage.get("output_tokens"))
    details = usage.get("completion_tokens_details") or usage.get("output_tokens_details") or {}
    record.reasoning_tokens = details.get("reasoning_tokens")
    record.output_tokens_source = "usage" if record.output_tokens is not None else ""
    record.reasoning_tokens_source = "usage" if record.reasoning_tokens is not None else ""


def _parse_json(data: str) -> dict[str, Any]:
    try:
        parsed = json.loads(data)
    except json.JSONDecodeError as exc:
        raise _StreamError("BadChunk", f"not JSON: {data[:_ERROR_BODY_CHARS]!r}") from exc
    if not isinstance(parsed, dict):
        raise _StreamError("BadChunk", f"not a JSON object: {data[:_ERROR_BODY_CHARS]!r}")
    if "error" in parsed and parsed["error"]:
        raise _StreamError("ServerError", json.dumps(parsed["error"])[:_ERROR_BODY_CHARS])
    return parsed


def _on_event(endpoint: str, stream: _StreamState, event_type: str | None, data: str, now: float):
    if endpoint == "responses":
        _on_responses_event(stream, event_type, data, now)
    elif endpoint == "completions":
        _on_completions_chunk(stream, data, now)
    else:
        _on_chat_chunk(stream, data, now)


def _on_chat_chunk(stream: _StreamState, data: str, now: float) -> None:
    if data.strip() == "[DONE]":
        stream.done = True
        return
    chunk = _parse_json(data)
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        # vLLM and SGLang name the reasoning delta `reasoning_content`, newer servers `reasoning`.
        reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
        stream.on_text(now, delta.get("content") or "", reasoning)
        stream.finish_reason = choice.get("finish_reason") or stream.finish_reason
    if chunk.get("usage"):
        stream.usage = chunk["usage"]


def _on_completions_chunk(stream: _StreamState, data: str, now: float) -> None:
    if data.strip() == "[DONE]":
        stream.done = True
        return
    chunk = _parse_json(data)
    for choice in chunk.get("choices") or []:
        stream.on_text(now, choice.get("text") or "", "")
        stream.finish_reason = choice.get("finish_reason") or stream.finish_reason
    if chunk.get("usage"):
        stream.usage = chunk["usage"]


def _on_responses_event(stream: _StreamState, event_type: str | None, data: str, now: float):
    event = _parse_json(data)
    kind = event.get("type") or event_type or ""
    if kind in ("response.output_text.delta", "response.refusal.delta"):
        stream.on_text(now, event.get("delta") or "", "")
    elif kind.startswith("response.reasoning") and kind.endswith(".delta"):
        stream.on_text(now, "", event.get("delta") or "")
    elif kind in ("response.completed", "response.incomplete"):
        response = event.get("response") or {}
        stream.usage = response.get("usage")
        details = response.get("incomplete_details") or {}
        stream.finish_reason = details.get("reason") or response.get("status") or kind
        stream.done = True
    elif kind in ("response.failed", "error"):
        raise _StreamError("ServerError", data[:_ERROR_BODY_CHARS])
