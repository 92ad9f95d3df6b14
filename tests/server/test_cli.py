"""`gossamer serve` wiring, with the engine and uvicorn replaced."""

from __future__ import annotations

import argparse
import sys
import types

import pytest

from gossamer.server import cli
from gossamer.server.engine_api import EngineClient
from tests.server.fake_engine import FakeEngine


def test_fake_engine_satisfies_the_protocol(harmony_tokenizer) -> None:  # type: ignore[no-untyped-def]
    assert isinstance(FakeEngine(harmony_tokenizer), EngineClient)


def test_serve_builds_the_app_around_the_engine(
    harmony_tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    engine = FakeEngine(harmony_tokenizer)
    seen_args = []

    class AsyncEngine:
        @staticmethod
        def from_args(args: argparse.Namespace) -> FakeEngine:
            seen_args.append(args)
            return engine

    module = types.ModuleType("gossamer.engine.async_engine")
    module.AsyncEngine = AsyncEngine  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gossamer.engine.async_engine", module)
    served = {}

    def fake_uvicorn_run(app, **kwargs) -> None:  # type: ignore[no-untyped-def]
        served.update(app=app, **kwargs)

    monkeypatch.setattr("uvicorn.run", fake_uvicorn_run)
    frozen = []
    monkeypatch.setattr(cli.gc, "freeze", lambda: frozen.append(True))  # not the test process
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(
        ["--model", "gpt-oss-20b", "--port", "9123", "--api-key", "k",
         "--served-model-name", "a", "b", "--response-store-size", "7"]
    )  # fmt: skip
    assert cli.run(args) == 0
    assert frozen == [True]  # the long-lived server's heap leaves the collector's generations
    assert seen_args == [args] and args.model == "gpt-oss-20b"
    assert served["port"] == 9123 and served["host"] == "0.0.0.0"
    ctx = served["app"].state.ctx
    assert ctx.engine is engine and ctx.served_model_names == ["a", "b"] and ctx.api_key == "k"
    assert served["app"].state.response_store.capacity == 7


def test_engine_module_stays_free_of_the_web_stack() -> None:
    """gossamer.server.engine_api is what the engine may import: no FastAPI behind it."""
    import subprocess

    code = (
        "import sys; import gossamer.server.engine_api; "
        "bad = [m for m in ('fastapi', 'uvicorn', 'pydantic', 'starlette') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
