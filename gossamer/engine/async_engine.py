"""AsyncEngine: per-request async streams over one EngineCore driven by a background thread.

The model's forward pass blocks (CPU or GPU), so the engine loop runs in its own thread and the
event loop only moves small messages: commands go in through a queue, outputs come back with
`call_soon_threadsafe`. Only the engine thread touches the EngineCore.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

from gossamer.engine.core import EngineCore
from gossamer.engine.errors import EngineDeadError
from gossamer.engine.outputs import EngineStats, RequestOutput
from gossamer.models import DEFAULT_MODEL
from gossamer.sampling_params import SamplingParams
from gossamer.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    num_choices: int

    def put(self, item: RequestOutput | BaseException) -> bool:
        """Hand an item to the client's event loop; False when that loop has closed."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the client's loop is gone: nobody will read this stream
            return False
        return True


class AsyncEngine:
    def __init__(self, core: EngineCore, model_name: str) -> None:
        self.core = core
        self.tokenizer: Tokenizer | None = core.tokenizer
        self.model_name = model_name
        self.max_model_len = core.max_model_len
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._wake = threading.Event()
        self._stop = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="gossamer-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> AsyncEngine:
        """Load the model named by the CLI flags (see engine.args) and start the engine loop."""
        from gossamer.engine.args import engine_config_from_args
        from gossamer.engine.generate_cli import load_from_args

        loaded = load_from_args(args)
        tokenizer = None
        if loaded.checkpoint is not None and (loaded.checkpoint / "tokenizer.json").is_file():
            tokenizer = Tokenizer.from_file(loaded.checkpoint)
        core = EngineCore(loaded.model, tokenizer, engine_config_from_args(args))
        return cls(core, served_name(args))

    # ---- client side (event loop) --------------------------------------------------------------

    def is_ready(self) -> bool:
        return self._thread.is_alive() and self._error is None

    def stats(self) -> EngineStats:
        return self.core.stats

    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str,
        cache_salt: str | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream the request's outputs. Leaving the loop early (a client that went away) aborts
        the request in the engine, which frees its KV blocks before the next step."""
        if self._error is not None:
            raise EngineDeadError(f"the engine stopped: {self._error}")
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue(), params.n)
        accepted: concurrent.futures.Future = concurrent.futures.Future()
        self._send(("add", request_id, prompt_token_ids, params, cache_salt, stream, accepted))
        await asyncio.wrap_future(accepted)  # raises the RequestError of a bad request
        finished = 0
        try:
            while finished < stream.num_choices:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished += item.finished
                yield item
        finally:
            if finished < stream.num_choices:
                self._send(("abort", request_id))

    async def abort(self, request_id: str) -> None:
        self._send(("abort", request_id))

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=30)

    def _send(self, command: tuple) -> None:
        self._commands.put(command)
        self._wake.set()

    # ---- engine side (thread) ------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while not self._stop:
                self._drain_commands()
                if self.core.has_unfinished_requests():
                    self._dispatch(self.core.step())
                else:
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
        except BaseException as error:  # noqa: BLE001 - every stream must hear of it
            logger.exception("engine loop failed")
            self._error = error
            for stream in self._streams.values():
                stream.put(EngineDeadError(f"the engine stopped: {error}"))
            self._streams.clear()

    def _drain_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command[0] == "add":
                self._add(*command[1:])
            else:
                self.core.abort(command[1])
                self._streams.pop(command[1], None)

    def _add(self, request_id, prompt, params, cache_salt, stream, accepted) -> None:
        try:
            self.core.add_request(request_id, prompt, params, cache_salt)
        except Exception as error:  # noqa: BLE001 - handed back to the caller
            _settle(stream, accepted.set_exception, error)
            return
        if _settle(stream, accepted.set_result, None):
            self._streams[request_id] = stream
        else:  # the caller's loop closed before the request started
            self.core.abort(request_id)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue
            if not stream.put(output):
                self.core.abort(output.request_id)
                self._streams.pop(output.request_id, None)
            elif output.finished and not self.core.user_requests.get(output.request_id):
                self._streams.pop(output.request_id, None)


def served_name(args: argparse.Namespace) -> str:
    """The model name clients see: --served-model-name, else --model as given, else the default."""
    names = getattr(args, "served_model_name", None)
    if names:
        return names[0] if isinstance(names, list) else names
    return args.model or DEFAULT_MODEL


def _settle(stream: _Stream, setter, value) -> bool:
    try:
        stream.loop.call_soon_threadsafe(setter, value)
    except RuntimeError:
        return False
    return True
