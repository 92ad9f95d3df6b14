"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with an HTTP status.

Every failure a client can see goes through `ApiError`, so status codes and bodies stay uniform
across endpoints, and the same body is used for in-stream error events.
"""

from __future__ import annotations

import logging
from typing import Any

from gossamer.engine.errors import EngineDeadError, RequestError
from gossamer.harmony import ChatFormatError
from gossamer.sampling_params import SamplingParamsError

logger = logging.getLogger(__name__)

INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
NOT_FOUND = "not_found_error"
SERVER_ERROR = "server_error"
UNAVAILABLE = "service_unavailable_error"


class ApiError(Exception):
    """An error response. Raise it anywhere in a handler; the app turns it into JSON."""

    def __init__(
        self,
        status_code: int,
        message: str,
        error_type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.error_type = error_type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, INVALID_REQUEST, param, code)


def as_api_error(error: BaseException) -> ApiError:
    """Map any exception from request handling to the error the client gets."""
    if isinstance(error, ApiError):
        return error
    if isinstance(error, RequestError):
        return ApiError(error.status_code, str(error), INVALID_REQUEST, error.param, error.code)
    if isinstance(error, SamplingParamsError):
        return bad_request(str(error), param=error.param)
    if isinstance(error, ChatFormatError):
        return bad_request(str(error), param="messages")
    if isinstance(error, EngineFailure):
        return ApiError(500, f"the engine failed this request: {error}", SERVER_ERROR)
    if isinstance(error, EngineDeadError):
        return ApiError(500, f"the engine stopped: {error}", SERVER_ERROR)
    logger.exception("internal error while serving a request", exc_info=error)
    return ApiError(500, f"internal server error: {type(error).__name__}: {error}", SERVER_ERROR)


class EngineFailure(RuntimeError):
    """The engine reported `finish_reason == "error"` for a request."""
