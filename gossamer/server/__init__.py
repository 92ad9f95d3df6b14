"""OpenAI-compatible HTTP server around an injected engine (see engine_api.EngineClient).

`build_app` is imported lazily: `gossamer.server.engine_api` must stay importable without
FastAPI, so the engine can name the protocol it implements.
"""

from __future__ import annotations

from typing import Any

__all__ = ["build_app"]


def __getattr__(name: str) -> Any:
    if name == "build_app":
        from gossamer.server.app import build_app

        return build_app
    raise AttributeError(f"module 'gossamer.server' has no attribute {name!r}")
