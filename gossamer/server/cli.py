"""`gossamer serve`: load the model into an AsyncEngine and serve the OpenAI-compatible API."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys

from gossamer.engine.args import add_engine_arguments
from gossamer.engine.generate_cli import add_model_arguments

API_KEY_ENV = "GOSSAMER_API_KEY"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_engine_arguments(parser)
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="0.0.0.0", help="address to listen on")
    server.add_argument("--port", type=int, default=8000)
    server.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help=f"require 'Authorization: Bearer KEY' on /v1 routes (default: ${API_KEY_ENV})",
    )
    server.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        help="name(s) clients use in 'model'; the first is reported (default: the model's)",
    )
    server.add_argument(
        "--response-store-size",
        type=int,
        default=1000,
        help="responses kept in memory for previous_response_id (least recently used dropped)",
    )
    server.add_argument(
        "--log-level", choices=("debug", "info", "warning", "error"), default="info"
    )


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from gossamer.config import ConfigError
    from gossamer.engine.async_engine import AsyncEngine
    from gossamer.server.app import build_app

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        engine = AsyncEngine.from_args(args)
    except (ConfigError, ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    # The model, graphs and tables built so far live as long as the server: frozen out of the
    # collector's generations, a full collection no longer walks them (one paused a step for
    # ~100 ms on the CPU, 2026-12-03).
    gc.freeze()
    app = build_app(
        engine,
        served_model_name=args.served_model_name,
        api_key=args.api_key,
        response_store_size=args.response_store_size,
    )
    uvicorn.run(
        app, host=args.host, port=args.port, log_level=args.log_level, timeout_keep_alive=30
    )
    return 0
