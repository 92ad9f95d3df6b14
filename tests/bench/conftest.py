"""Fixtures for the `gossamer bench` tests: a controllable local OpenAI-compatible server."""

from __future__ import annotations

import contextlib

import pytest

from tests.bench.fake_openai_server import Behaviour, FakeOpenAIServer


@pytest.fixture
def fake_server():
    """`fake_server(policy)` starts a server for this test; it stops when the test ends."""
    with contextlib.ExitStack() as stack:

        def start(policy=None) -> FakeOpenAIServer:
            return stack.enter_context(FakeOpenAIServer(policy or Behaviour()))

        yield start
