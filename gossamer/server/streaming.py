"""Server-sent events, and noticing a client that went away.

Starlette's own StreamingResponse only notices a lost client when a write fails (or, on old ASGI
servers, cancels the stream without closing its iterator). A request waiting in the engine's
queue writes nothing for a long time, so here a watcher listens for `http.disconnect` the whole
time, cancels the stream at once, and the body iterator is always closed: its `finally` blocks
close the engine runs, which aborts them and frees their KV blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

logger = logging.getLogger(__name__)
T = TypeVar("T")
DONE = "data: [DONE]\n\n"
CLIENT_CLOSED = 499  # nginx's code for "client closed the request"; logged, never received
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_data(payload: dict[str, Any], event: str | None = None) -> str:
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event}\ndata: {data}\n\n" if event else f"data: {data}\n\n"


async def wait_for_disconnect(receive: Receive) -> None:
    """Returns when the client is gone (call only after the request body was read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class EventStreamResponse(StreamingResponse):
    """text/event-stream whose body iterator is cancelled on disconnect and always closed."""

    def __init__(self, events: AsyncIterator[str]) -> None:
        super().__init__(events, media_type="text/event-stream", headers=SSE_HEADERS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        stream = asyncio.create_task(self._stream(send))
        watcher = asyncio.create_task(wait_for_disconnect(receive))
        try:
            await asyncio.wait((stream, watcher), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (stream, watcher):
                task.cancel()
            await asyncio.gather(stream, watcher, return_exceptions=True)
            if not stream.cancelled() and stream.exception() is not None:
                logger.error("event stream failed", exc_info=stream.exception())
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _stream(self, send: Send) -> None:
        with contextlib.suppress(OSError):  # the client went away mid-write
            await self.stream_response(send)


async def cancel_on_disconnect(request: Request, work: Callable[[], Awaitable[T]]) -> T | None:
    """Run `work()` (a non-streaming handler); if the client disconnects first, cancel it (its
    cleanup aborts the engine request) and return None: nobody is left to answer."""
    task = asyncio.ensure_future(work())
    watcher = asyncio.create_task(wait_for_disconnect(request.receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)
    if task.cancelled():
        return None
    return task.result()
