"""What the HTTP server needs from an engine: the `EngineClient` protocol.

The server takes any object with this shape (the real `AsyncEngine`, or a scripted fake in the
tests), so the whole API can be tested without a model. Nothing here imports the web stack.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from gossamer.engine.outputs import EngineStats, RequestOutput
    from gossamer.sampling_params import SamplingParams
    from gossamer.tokenizer import Tokenizer


@runtime_checkable
class EngineClient(Protocol):
    """The engine as the server sees it.

    Contract the server relies on:

    - `generate` is an async generator. It raises `gossamer.engine.errors.RequestError` (e.g.
      `PromptTooLongError`) *before its first yield* for a request it cannot take; the server
      turns that into an HTTP 400. Later failures either raise any other exception or yield a
      `RequestOutput` with `finish_reason == "error"` and `error` set; both become HTTP 500
      (or an error event in a stream).
    - Each yielded `RequestOutput` carries the tokens produced since the previous update of
      that choice; with `params.n > 1` the updates of all choices interleave, told apart by
      `.index`, and the generator ends once every choice has yielded `finished=True`.
    - The server passes every stop token itself (`params.stop_token_ids`: the Harmony
      `<|return|>`/`<|call|>` for chat and responses, the tokenizer's eos ids for completions,
      none when `ignore_eos`); the engine applies `params.stop` strings to `text_delta`.
    - When the consumer stops early (client gone), the server closes the generator (`aclose`,
      or cancels the task awaiting it) and *also* awaits `abort(request_id)`: both must free the
      request's KV blocks, and `abort` must accept an id that is unknown or already finished.
    - Optional: `async def start()` / `async def shutdown()`, awaited from the app's lifespan
      when present (for an engine that runs a background loop in the server's event loop).
    """

    tokenizer: Tokenizer
    model_name: str  # default served model name
    max_model_len: int

    def is_ready(self) -> bool: ...

    def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str,
        cache_salt: str | None = None,
    ) -> AsyncIterator[RequestOutput]: ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...
