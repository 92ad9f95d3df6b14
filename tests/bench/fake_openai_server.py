"""A small OpenAI-compatible streaming server whose token timing and failures the test controls.

A plain asyncio HTTP/1.1 server (keep-alive, chunked SSE) on a free 127.0.0.1 port, running in
a background thread. Each POST gets a `Behaviour` from the test: delays before the first token
and between tokens, reasoning tokens first, usage on or off, an HTTP error status, or a stream
cut midway (connection closed without the chunked terminator).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MODEL = "fake-model"
OWNED_BY = "fakeengine"


@dataclass(frozen=True)
class Behaviour:
    status: int = 200
    first_token_delay: float = 0.0  # seconds from request to the first token event
    token_delay: float = 0.0  # seconds between token events
    reasoning_tokens: int = 0  # streamed before the content
    content_tokens: int | None = None  # default: max tokens - reasoning tokens
    cut_after: int | None = None  # close the connection after this many token events
    send_usage: bool = True
    send_done: bool = True  # [DONE] / response.completed at the end
    error_event: bool = False  # an in-stream error instead of tokens


@dataclass
class SeenRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    arrived: float  # time.perf_counter()


Policy = Callable[[int, SeenRequest], Behaviour]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def count_words(body: dict[str, Any]) -> int:
    """The fake server's 'tokenizer': whitespace-separated words of everything sent."""
    texts = [body.get("prompt") or "", body.get("instructions") or ""]
    texts += [m["content"] for m in body.get("messages") or []]
    if isinstance(body.get("input"), list):
        texts += [m["content"] for m in body["input"]]
    elif isinstance(body.get("input"), str):
        texts.append(body["input"])
    return sum(len(t.split()) for t in texts)


class FakeOpenAIServer:
    def __init__(self, policy: Behaviour | Policy = Behaviour()) -> None:
        self.policy: Policy = policy if callable(policy) else (lambda _i, _r: policy)
        self.requests: list[SeenRequest] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.connections = 0  # TCP connections accepted
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def posts(self) -> list[SeenRequest]:
        return [r for r in self.requests if r.method == "POST"]

    def __enter__(self) -> FakeOpenAIServer:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._start(), self._loop)
        future.result(timeout=10)
        return self

    def __exit__(self, *exc_info) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._serve_connection, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        self._server.close()
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve_connection(self, reader, writer) -> None:
        self.connections += 1
        try:
            while await self._serve_one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _serve_one(self, reader, writer) -> bool:
        """Answer one request; False when the connection should close."""
        head = await reader.readuntil(b"\r\n\r\n")
        request_line, *header_lines = head.decode().split("\r\n")
        method, path, _ = request_line.split(" ", 2)
        headers = {}
        for line in header_lines:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        raw = await reader.readexactly(int(headers.get("content-length", 0)))
        seen = SeenRequest(
            method, path, headers, json.loads(raw) if raw else {}, time.perf_counter()
        )
        self.requests.append(seen)
        if method == "GET":
            return await self._answer_get(writer, path)
        behaviour = self.policy(len(self.posts) - 1, seen)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._answer_post(writer, seen, behaviour)
        finally:
            self.in_flight -= 1

    async def _answer_get(self, writer, path: str) -> bool:
        if path == "/v1/models":
            models = {
                "object": "list",
                "data": [{"id": MODEL, "object": "model", "owned_by": OWNED_BY}],
            }
            await _send_json(writer, 200, models)
        else:
            await _send_json(writer, 404, {"error": {"message": f"no route {path}"}})
        return True

    async def _answer_post(self, writer, seen: SeenRequest, behaviour: Behaviour) -> bool:
        endpoint = {
            "/v1/chat/completions": "chat",
            "/v1/completions": "completions",
            "/v1/responses": "responses",
        }.get(seen.path)
        if endpoint is None:
            await _send_json(writer, 404, {"error": {"message": f"no route {seen.path}"}})
            return True
        if behaviour.status != 200:
            error = {"error": {"message": f"injected status {behaviour.status}", "type": "test"}}
            await _send_json(writer, behaviour.status, error)
            return True
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        await writer.drain()
        stream = _SseStream(writer, endpoint, seen.body, behaviour)
        finished = await stream.run()
        if not finished:  # cut midway: close without the chunked terminator
            return False
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


class _SseStream:
    def __init__(self, writer, endpoint: str, body: dict[str, Any], behaviour: Behaviour) -> None:
        self.writer, self.endpoint, self.body, self.behaviour = writer, endpoint, body, behaviour
        max_tokens = (
            body.get("max_completion_tokens")
            or body.get("max_tokens")
            or body.get("max_output_tokens")
            or 16
        )
        self.num_reasoning = behaviour.reasoning_tokens
        content = behaviour.content_tokens
        self.num_content = (
            content if content is not None else max(0, max_tokens - self.num_reasoning)
        )

    async def run(self) -> bool:
        """Stream every event; False if the stream was cut on purpose."""
        b = self.behaviour
        if self.endpoint == "chat":  # like real servers: a role-only chunk comes first
            await self._event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
        if b.error_event:
            await asyncio.sleep(b.first_token_delay)
            await self._event({"error": {"message": "injected error event", "code": 500}})
            return True
        kinds = ["reasoning"] * self.num_reasoning + ["content"] * self.num_content
        for index, kind in enumerate(kinds):
            if b.cut_after is not None and index >= b.cut_after:
                return False
            await asyncio.sleep(b.first_token_delay if index == 0 else b.token_delay)
            await self._token(kind, f"{kind[0]}{index} ")
        await self._finish()
        return True

    async def _event(self, data: dict[str, Any] | str, event: str | None = None) -> None:
        text = data if isinstance(data, str) else json.dumps(data)
        payload = (f"event: {event}\n" if event else "") + f"data: {text}\n\n"
        raw = payload.encode()
        self.writer.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
        await self.writer.drain()

    async def _token(self, kind: str, text: str) -> None:
        if self.endpoint == "chat":
            key = "reasoning_content" if kind == "reasoning" else "content"
            await self._event({"choices": [{"index": 0, "delta": {key: text}}]})
        elif self.endpoint == "completions":
            await self._event({"choices": [{"index": 0, "text": text}]})
        else:
            name = (
                "response.reasoning_text.delta"
                if kind == "reasoning"
                else "response.output_text.delta"
            )
            await self._event({"type": name, "delta": text}, event=name)

    def _usage(self) -> dict[str, Any]:
        prompt, output = count_words(self.body), self.num_reasoning + self.num_content
        if self.endpoint == "responses":
            return {
                "input_tokens": prompt,
                "output_tokens": output,
                "output_tokens_details": {"reasoning_tokens": self.num_reasoning},
                "total_tokens": prompt + output,
            }
        return {
            "prompt_tokens": prompt,
            "completion_tokens": output,
            "completion_tokens_details": {"reasoning_tokens": self.num_reasoning},
            "total_tokens": prompt + output,
        }

    async def _finish(self) -> None:
        b = self.behaviour
        if self.endpoint == "responses":
            if b.send_done:
                response = {"status": "completed", "usage": self._usage() if b.send_usage else None}
                await self._event(
                    {"type": "response.completed", "response": response}, "response.completed"
                )
            return
        final = {"index": 0, "finish_reason": "length"}
        final |= {"delta": {}} if self.endpoint == "chat" else {"text": ""}
        await self._event({"choices": [final]})  # finish-only chunk: carries no token
        wants_usage = (self.body.get("stream_options") or {}).get("include_usage")
        if b.send_usage and wants_usage:
            await self._event({"choices": [], "usage": self._usage()})
        if b.send_done:
            await self._event("[DONE]")


async def _send_json(writer, status: int, body: dict[str, Any]) -> None:
    raw = json.dumps(body).encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 429: "Too Many Requests"}.get(
        status, "Error"
    )
    writer.write(
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(raw)}\r\n\r\n".encode()
        + raw
    )
    await writer.drain()
