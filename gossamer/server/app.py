"""The FastAPI app: routes, API-key check, OpenAI-style errors everywhere, metrics.

`build_app(engine, served_model_name, api_key)` is the whole server; the engine is injected, so
tests run it with a scripted fake. Bodies are parsed by hand (JSON, then pydantic) so that every
bad request gets a 400 in OpenAI's error shape rather than FastAPI's 422.
"""

from __future__ import annotations

import inspect
import json
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from gossamer.engine.errors import EngineDeadError, RequestError
from gossamer.harmony import ChatFormatError
from gossamer.sampling_params import SamplingParamsError
from gossamer.server.chat import create_chat_completion
from gossamer.server.completions import create_completion
from gossamer.server.context import ServerContext
from gossamer.server.engine_api import EngineClient
from gossamer.server.errors import (
    AUTHENTICATION,
    NOT_FOUND,
    UNAVAILABLE,
    ApiError,
    EngineFailure,
    as_api_error,
    bad_request,
)
from gossamer.server.metrics import CONTENT_TYPE, RequestCountMiddleware, ServerMetrics
from gossamer.server.protocol import ChatCompletionRequest, CompletionRequest, ResponsesRequest
from gossamer.server.responses import (
    DEFAULT_STORE_SIZE,
    ResponseStore,
    create_response,
    get_stored_response,
)

logger = logging.getLogger(__name__)
Body = TypeVar("Body", bound=BaseModel)
OWNED_BY = "gossamer"


def build_app(
    engine: EngineClient,
    served_model_name: str | Sequence[str] | None = None,
    api_key: str | None = None,
    response_store_size: int = DEFAULT_STORE_SIZE,
) -> FastAPI:
    """An OpenAI-compatible app around `engine`. `served_model_name`: the name(s) clients may
    ask for (default: `engine.model_name`); `api_key`: required as `Authorization: Bearer` on
    /v1 routes when set (/health and /metrics stay open)."""
    names = _served_names(served_model_name, engine.model_name)
    ctx = ServerContext(engine, ServerMetrics(engine.stats), names, api_key or None)
    store = ResponseStore(response_store_size)
    app = FastAPI(title="Gossamer", lifespan=_lifespan(engine), docs_url=None, redoc_url=None)
    app.state.ctx = ctx
    app.state.response_store = store
    _add_error_handlers(app)
    _add_routes(app, ctx, store)
    app.add_middleware(RequestCountMiddleware, metrics=ctx.metrics)
    return app


def _served_names(served: str | Sequence[str] | None, default: str) -> list[str]:
    if served is None:
        return [default]
    names = [served] if isinstance(served, str) else list(served)
    return names or [default]


async def _call_maybe_async(method: Callable[[], Any] | None) -> None:
    """Engines may give start/shutdown as plain or async methods (AsyncEngine's are plain)."""
    if method is not None and inspect.isawaitable(result := method()):
        await result


def _lifespan(engine: EngineClient) -> Callable[[FastAPI], Any]:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await _call_maybe_async(getattr(engine, "start", None))
        try:
            yield
        finally:
            await _call_maybe_async(getattr(engine, "shutdown", None))

    return lifespan


# -- routes ---------------------------------------------------------------------------------------


def _add_routes(app: FastAPI, ctx: ServerContext, store: ResponseStore) -> None:
    def authorized(request: Request) -> None:
        _check_api_key(ctx, request)

    @app.get("/health")
    async def health() -> Response:
        if not ctx.engine.is_ready():
            return _error_response(ApiError(503, "the model is still loading", UNAVAILABLE))
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(ctx.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        authorized(request)
        data = [
            {
                "id": name,
                "object": "model",
                "created": ctx.created,
                "owned_by": OWNED_BY,
                "root": ctx.engine.model_name,
                "max_model_len": ctx.engine.max_model_len,
            }
            for name in ctx.served_model_names
        ]
        return JSONResponse({"object": "list", "data": data})

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        authorized(request)
        body = await _parse_body(request, ChatCompletionRequest)
        return await _answer(create_chat_completion(ctx, request, body))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        authorized(request)
        body = await _parse_body(request, CompletionRequest)
        return await _answer(create_completion(ctx, request, body))

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        authorized(request)
        body = await _parse_body(request, ResponsesRequest)
        return await _answer(create_response(ctx, store, request, body))

    @app.get("/v1/responses/{response_id}")
    async def get_response(request: Request, response_id: str) -> JSONResponse:
        authorized(request)
        return JSONResponse(get_stored_response(store, response_id))


async def _answer(work: Awaitable[Response]) -> Response:
    """Every failure becomes an OpenAI-style JSON error here, so none reaches Starlette's
    last-resort handler (which re-raises and makes uvicorn drop the connection)."""
    try:
        return await work
    except Exception as error:
        return _error_response(as_api_error(error))


def _check_api_key(ctx: ServerContext, request: Request) -> None:
    if ctx.api_key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(
        token.strip().encode(), ctx.api_key.encode()
    ):
        raise ApiError(
            401,
            "Incorrect or missing API key: send 'Authorization: Bearer <key>'.",
            AUTHENTICATION,
            code="invalid_api_key",
        )


async def _parse_body(request: Request, model: type[Body]) -> Body:
    raw = await request.body()
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise bad_request(f"The request body is not valid JSON: {error}.") from error
    if not isinstance(data, dict):
        raise bad_request("The request body must be a JSON object.")
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise _validation_error(error.errors()) from error


def _validation_error(errors: Sequence[Any]) -> ApiError:
    first = errors[0] if errors else {}
    location = [part for part in first.get("loc", ()) if part != "body"]
    # `param` names the top-level field (and list position): deeper parts of pydantic's path
    # also name union members ("str", "list[int]"), which mean nothing to a client.
    param = str(location[0]) if location else None
    if param is not None and len(location) > 1 and isinstance(location[1], int):
        param += f"[{location[1]}]"
    where = ".".join(str(part) for part in location) or "body"
    return bad_request(f"Invalid value for '{where}': {first.get('msg', 'invalid')}.", param=param)


# -- errors ---------------------------------------------------------------------------------------


def _error_response(error: ApiError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if error.status_code == 401 else None
    return JSONResponse(error.body(), status_code=error.status_code, headers=headers)


async def _mapped_error(_: Request, error: Exception) -> JSONResponse:
    return _error_response(as_api_error(error))


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, error: ApiError) -> JSONResponse:
        return _error_response(error)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, error: RequestValidationError) -> JSONResponse:
        return _error_response(_validation_error(error.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
        error_type = NOT_FOUND if error.status_code == 404 else "invalid_request_error"
        return _error_response(ApiError(error.status_code, str(error.detail), error_type))

    # Errors the handlers let through from the engine, sampling and Harmony layers: mapped here
    # rather than by the catch-all, which would also log them as server faults.
    for error_class in (
        RequestError,
        SamplingParamsError,
        ChatFormatError,
        EngineFailure,
        EngineDeadError,
    ):
        app.add_exception_handler(error_class, _mapped_error)

    @app.exception_handler(Exception)
    async def internal_error(_: Request, error: Exception) -> JSONResponse:
        return _error_response(as_api_error(error))
