"""One real server (uvicorn on a free 127.0.0.1 port, in a background thread) around the fake
engine, shared by the server tests; each test gets the engine reset and an `openai` client."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import openai
import pytest
import uvicorn

from gossamer.server.app import build_app
from tests.server.fake_engine import FakeEngine

API_KEY = "sk-gossamer-test"
MODEL = "gpt-oss-test"
ALIAS = "gpt-oss-alias"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerThread:
    def __init__(self, app) -> None:  # type: ignore[no-untyped-def]
        self.port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="session")
def shared_engine(harmony_tokenizer) -> FakeEngine:  # type: ignore[no-untyped-def]
    return FakeEngine(harmony_tokenizer)


@pytest.fixture(scope="session")
def server(shared_engine: FakeEngine) -> Iterator[ServerThread]:
    app = build_app(shared_engine, served_model_name=[MODEL, ALIAS], api_key=API_KEY)
    with ServerThread(app) as running:
        yield running


@pytest.fixture
def engine(shared_engine: FakeEngine, server: ServerThread) -> Iterator[FakeEngine]:
    shared_engine.reset()
    yield shared_engine
    shared_engine.reset()


@pytest.fixture
def client(server: ServerThread, engine: FakeEngine) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=20
    ) as client:
        yield client


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()
