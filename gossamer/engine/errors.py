"""Errors a request can cause. The server maps each to an OpenAI-style JSON error."""

from __future__ import annotations


class RequestError(ValueError):
    """Bad input from a client: HTTP 400 with this message; `param` names the field."""

    status_code = 400
    code: str | None = None

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class PromptTooLongError(RequestError):
    code = "context_length_exceeded"


class EngineDeadError(RuntimeError):
    """The engine loop stopped on an internal error; requests fail with HTTP 500."""
