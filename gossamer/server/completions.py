"""`POST /v1/completions`: raw text in, raw text out (no Harmony rendering or parsing).

`prompt` may be a string, a list of strings, a list of token ids or a list of such lists; each
prompt is its own engine request with `n` choices, numbered `prompt_index * n + choice`.
Special-token text in a string prompt (e.g. `<|start|>`) is read as the special token, so a
hand-written Harmony prompt works. The text is the engine's `text_delta` (stop strings applied).
Generation stops at the tokenizer's eos ids unless `ignore_eos`.

Not supported: `suffix` (400), `best_of` other than `n` (400). With `echo` and `logprobs` the
prompt tokens are listed with null logprobs (the engine computes no prompt logprobs).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gossamer.engine.outputs import RequestOutput
from gossamer.server.context import (
    ServerContext,
    build_sampling_params,
    check_logprobs,
    resolve_max_tokens,
)
from gossamer.server.errors import as_api_error, bad_request
from gossamer.server.formatting import LegacyLogprobs, extend_legacy
from gossamer.server.generation import EngineRun, close_all, merged_outputs, start_all
from gossamer.server.protocol import CompletionRequest
from gossamer.server.streaming import (
    CLIENT_CLOSED,
    DONE,
    EventStreamResponse,
    cancel_on_disconnect,
    sse_data,
)

ENDPOINT = "/v1/completions"


@dataclass
class _Choice:
    text: str = ""
    logprobs: dict[str, list[Any]] | None = None
    legacy: LegacyLogprobs | None = None
    output: RequestOutput | None = field(default=None, repr=False)


@dataclass
class CompletionJob:
    body: CompletionRequest
    model: str
    request_id: str
    runs: list[EngineRun]
    prompts: list[list[int]]
    created: int


async def create_completion(
    ctx: ServerContext, request: Request, body: CompletionRequest
) -> Response:
    ctx.check_ready()
    # Rendering and tokenizing a long prompt takes milliseconds: off the event loop, so
    # streams in flight keep flowing.
    job = await asyncio.to_thread(prepare_completion, ctx, body)

    if await cancel_on_disconnect(request, lambda: start_all(job.runs)) is None:
        await close_all(job.runs)
        return Response(status_code=CLIENT_CLOSED)
    if body.stream:
        return EventStreamResponse(stream_completion(ctx, job))
    result = await cancel_on_disconnect(request, lambda: collect_completion(ctx, job))
    return JSONResponse(result) if result is not None else Response(status_code=CLIENT_CLOSED)


def prepare_completion(ctx: ServerContext, body: CompletionRequest) -> CompletionJob:
    model = ctx.check_model(body.model)
    if body.suffix is not None:
        raise bad_request("'suffix' is not supported.", param="suffix")
    if body.best_of is not None and body.best_of != body.n:
        raise bad_request("'best_of' is not supported (other than best_of == n).", param="best_of")
    check_logprobs(body.logprobs, "logprobs")
    prompts = _prompt_token_ids(ctx, body.prompt)
    request_id = f"cmpl-{uuid.uuid4().hex}"
    tokenizer = ctx.engine.tokenizer
    stop_ids = () if body.ignore_eos else tuple(tokenizer.eos_token_ids)
    runs = []
    for position, prompt_ids in enumerate(prompts):
        max_tokens = resolve_max_tokens(
            body.max_tokens, "max_tokens", len(prompt_ids), ctx.engine.max_model_len, "prompt"
        )
        params = build_sampling_params(
            body,
            n=body.n,
            max_tokens=max_tokens,
            stop_token_ids=stop_ids,
            logprobs=body.logprobs,
            skip_special_tokens=body.skip_special_tokens,
        )
        run_id = request_id if len(prompts) == 1 else f"{request_id}-{position}"
        runs.append(
            EngineRun(
                ctx.engine, ctx.metrics, ENDPOINT, prompt_ids, params, run_id, body.cache_salt
            )
        )
    return CompletionJob(body, model, request_id, runs, prompts, int(time.time()))


def _prompt_token_ids(ctx: ServerContext, prompt: Any) -> list[list[int]]:
    tokenizer = ctx.engine.tokenizer
    if isinstance(prompt, str):
        prompts = [tokenizer.encode(prompt, allow_special=True)]
    elif prompt and all(isinstance(item, str) for item in prompt):
        prompts = [tokenizer.encode(text, allow_special=True) for text in prompt]
    elif prompt and all(isinstance(item, int) for item in prompt):
        prompts = [list(prompt)]
    else:
        prompts = [list(ids) for ids in prompt]
    if not prompts or any(not ids for ids in prompts):
        raise bad_request("'prompt' must not be empty.", param="prompt")
    vocab_size = tokenizer.vocab_size
    if any(not 0 <= token < vocab_size for ids in prompts for token in ids):
        raise bad_request(f"prompt token ids must be in [0, {vocab_size}).", param="prompt")
    return prompts


def _choice_index(job: CompletionJob, run_position: int, output: RequestOutput) -> int:
    return run_position * job.body.n + output.index


def _new_choices(ctx: ServerContext, job: CompletionJob) -> dict[int, _Choice]:
    choices = {}
    for position in range(len(job.prompts)):
        for choice_index in range(job.body.n):
            choice = _Choice()
            if job.body.logprobs is not None:
                choice.legacy = LegacyLogprobs(ctx.engine.tokenizer, job.body.logprobs)
            choices[position * job.body.n + choice_index] = choice
    return choices


def _echo(ctx: ServerContext, job: CompletionJob, position: int, choice: _Choice) -> str:
    """The prompt text (and its null-logprob entries) for a choice's start."""
    prompt_ids = job.prompts[position]
    if choice.legacy is not None:
        choice.logprobs = extend_legacy(choice.logprobs, choice.legacy.entries(prompt_ids, []))
    return ctx.engine.tokenizer.decode(prompt_ids)


def _usage(job: CompletionJob) -> dict[str, Any]:
    prompt_tokens = sum(run.usage.prompt_tokens for run in job.runs)
    completion_tokens = sum(run.usage.completion_tokens for run in job.runs)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {
            "cached_tokens": sum(run.usage.cached_tokens for run in job.runs)
        },
    }


def _finish_reason(output: RequestOutput) -> str:
    return "length" if output.finish_reason == "length" else "stop"


def _logprobs_part(choice: _Choice, output: RequestOutput) -> dict[str, list[Any]] | None:
    if choice.legacy is None:
        return None
    return choice.legacy.entries(output.new_token_ids, output.new_logprobs)


async def collect_completion(ctx: ServerContext, job: CompletionJob) -> dict[str, Any]:
    choices = _new_choices(ctx, job)
    if job.body.echo:
        for index, choice in choices.items():
            choice.text = _echo(ctx, job, index // job.body.n, choice)
    try:
        async for position, output in merged_outputs(job.runs):
            choice = choices[_choice_index(job, position, output)]
            choice.text += output.text_delta
            part = _logprobs_part(choice, output)
            if part is not None:
                choice.logprobs = extend_legacy(choice.logprobs, part)
            if output.finished:
                choice.output = output
    finally:
        await close_all(job.runs)
    return {
        "id": job.request_id,
        "object": "text_completion",
        "created": job.created,
        "model": job.model,
        "choices": [
            {
                "index": index,
                "text": choice.text,
                "logprobs": choice.logprobs,
                "finish_reason": _finish_reason(choice.output) if choice.output else "stop",
                "stop_reason": choice.output.stop_reason if choice.output else None,
            }
            for index, choice in sorted(choices.items())
        ],
        "usage": _usage(job),
    }


async def stream_completion(ctx: ServerContext, job: CompletionJob) -> AsyncIterator[str]:
    include_usage = bool(job.body.stream_options and job.body.stream_options.include_usage)

    def chunk(index: int, text: str, logprobs: Any, output: RequestOutput | None) -> str:
        finished = output is not None and output.finished
        payload: dict[str, Any] = {
            "id": job.request_id,
            "object": "text_completion",
            "created": job.created,
            "model": job.model,
            "choices": [
                {
                    "index": index,
                    "text": text,
                    "logprobs": logprobs,
                    "finish_reason": _finish_reason(output) if finished and output else None,
                    "stop_reason": output.stop_reason if finished and output else None,
                }
            ],
        }
        if include_usage:
            payload["usage"] = None
        return sse_data(payload)

    choices = _new_choices(ctx, job)
    try:
        if job.body.echo:
            for index, choice in choices.items():
                text = _echo(ctx, job, index // job.body.n, choice)
                yield chunk(index, text, choice.logprobs, None)
        async for position, output in merged_outputs(job.runs):
            index = _choice_index(job, position, output)
            part = _logprobs_part(choices[index], output)
            if output.text_delta or output.finished or part:
                yield chunk(index, output.text_delta, part, output)
        if include_usage:
            usage_payload = {
                "id": job.request_id,
                "object": "text_completion",
                "created": job.created,
                "model": job.model,
                "choices": [],
                "usage": _usage(job),
            }
            yield sse_data(usage_payload)
    except Exception as error:
        yield sse_data(as_api_error(error).body())
    finally:
        await close_all(job.runs)
    yield DONE
