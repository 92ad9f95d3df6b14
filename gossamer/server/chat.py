"""`POST /v1/chat/completions` for GPT-OSS: messages -> Harmony prompt -> engine -> Harmony
parse -> `reasoning_content` (mirrored as `reasoning`), `content` and `tool_calls`.

Streaming sends, per choice: a role chunk, then deltas in the order the model wrote them
(reasoning, content, tool calls as `{index, id, type, function: {name, arguments: ""}}`
followed by argument chunks), then a chunk with `finish_reason`; with
`stream_options.include_usage` a last chunk with empty `choices` and the usage; then [DONE].
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
from gossamer.runner.sampler import TokenLogprobs
from gossamer.server.context import (
    ServerContext,
    build_sampling_params,
    check_logprobs,
    resolve_max_tokens,
)
from gossamer.server.errors import as_api_error, bad_request
from gossamer.server.formatting import chat_logprob_entries, chat_usage
from gossamer.server.generation import EngineRun, merged_outputs
from gossamer.server.harmony_output import (
    FUNCTION_CALL,
    ITEM_SEPARATOR,
    MESSAGE,
    REASONING,
    HarmonyOutput,
    ItemDelta,
    ItemEvent,
    ItemStart,
    harmony_stop_token_ids,
    render_prompt,
)
from gossamer.server.protocol import ChatCompletionRequest, NamedToolChoice
from gossamer.server.streaming import (
    CLIENT_CLOSED,
    DONE,
    EventStreamResponse,
    cancel_on_disconnect,
    sse_data,
)
from gossamer.server.tools import FunctionSpec, ToolPlan, plan_tools

ENDPOINT = "/v1/chat/completions"


@dataclass
class ChatJob:
    """A validated chat request, ready for the engine."""

    body: ChatCompletionRequest
    model: str
    run: EngineRun
    plan: ToolPlan
    top_logprobs: int | None  # None: no logprobs
    created: int

    def new_choice(self, ctx: ServerContext) -> HarmonyOutput:
        return HarmonyOutput(
            ctx.engine.tokenizer,
            prefill_ids=self.plan.prefill_ids,
            stop=self.run.params.stop,
            include_stop_str=self.body.include_stop_str_in_output,
        )


async def create_chat_completion(
    ctx: ServerContext, request: Request, body: ChatCompletionRequest
) -> Response:
    ctx.check_ready()
    # Rendering and tokenizing a long prompt takes milliseconds: off the event loop, so
    # streams in flight keep flowing.
    job = await asyncio.to_thread(prepare_chat, ctx, body)
    if await cancel_on_disconnect(request, job.run.start) is None:
        await job.run.close()
        return Response(status_code=CLIENT_CLOSED)
    if body.stream:
        return EventStreamResponse(stream_chat(ctx, job))
    result = await cancel_on_disconnect(request, lambda: collect_chat(ctx, job))
    return JSONResponse(result) if result is not None else Response(status_code=CLIENT_CLOSED)


def prepare_chat(ctx: ServerContext, body: ChatCompletionRequest) -> ChatJob:
    model = ctx.check_model(body.model)
    tokenizer = ctx.engine.tokenizer
    if not body.messages:
        raise bad_request("'messages' must contain at least one message.", param="messages")
    if body.response_format is not None and body.response_format.type != "text":
        raise bad_request(
            f"response_format {body.response_format.type!r} is not supported; use 'text'.",
            param="response_format",
        )
    plan = _tool_plan(ctx, body)
    prompt_ids = render_prompt(tokenizer, body.messages, plan.tools, body.reasoning_effort)
    prompt_ids += plan.prefill_ids
    if body.max_completion_tokens is not None:
        requested, param = body.max_completion_tokens, "max_completion_tokens"
    else:
        requested, param = body.max_tokens, "max_tokens"
    max_tokens = resolve_max_tokens(
        requested, param, len(prompt_ids), ctx.engine.max_model_len, "messages"
    )
    top_logprobs = (body.top_logprobs or 0) if body.logprobs else None
    check_logprobs(top_logprobs, "top_logprobs")
    stop_ids = () if body.ignore_eos else harmony_stop_token_ids(tokenizer)
    params = build_sampling_params(
        body, n=body.n, max_tokens=max_tokens, stop_token_ids=stop_ids, logprobs=top_logprobs
    )
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    run = EngineRun(
        ctx.engine, ctx.metrics, ENDPOINT, prompt_ids, params, request_id, body.cache_salt
    )
    return ChatJob(body, model, run, plan, top_logprobs, int(time.time()))


def _tool_plan(ctx: ServerContext, body: ChatCompletionRequest) -> ToolPlan:
    functions = [
        FunctionSpec(tool.function.name, tool.function.description, tool.function.parameters)
        for tool in body.tools or []
    ]
    choice = body.tool_choice
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    plain = choice if isinstance(choice, str) else None
    return plan_tools(ctx.engine.tokenizer, functions, plain, named, "tools")


def finish_reason(output: RequestOutput, choice: HarmonyOutput) -> str:
    if output.finish_reason == "length":
        return "length"
    if choice.tool_calls:
        return "tool_calls"
    return "stop"


def usage_of(job: ChatJob, choices: dict[int, HarmonyOutput]) -> dict[str, Any]:
    usage = job.run.usage
    reasoning = sum(choice.num_reasoning_tokens for choice in choices.values())
    return chat_usage(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens, reasoning)


def _record_anomalies(ctx: ServerContext, choices: dict[int, HarmonyOutput]) -> None:
    for choice in choices.values():
        for kind, count in choice.anomalies.items():
            ctx.metrics.harmony_anomalies.labels(kind).inc(count)


# -- non-streaming --------------------------------------------------------------------------------


async def collect_chat(ctx: ServerContext, job: ChatJob) -> dict[str, Any]:
    choices = {index: job.new_choice(ctx) for index in range(job.run.params.n)}
    finishes: dict[int, RequestOutput] = {}
    try:
        async for _, output in merged_outputs([job.run]):
            choice = choices[output.index]
            choice.add(output.new_token_ids, output.new_logprobs)
            if output.finished:
                choice.finish()
                finishes[output.index] = output
    finally:
        await job.run.close()
        _record_anomalies(ctx, choices)
    return {
        "id": job.run.request_id,
        "object": "chat.completion",
        "created": job.created,
        "model": job.model,
        "choices": [
            _choice_body(ctx, job, index, choice, finishes.get(index))
            for index, choice in sorted(choices.items())
        ],
        "usage": usage_of(job, choices),
    }


def _choice_body(
    ctx: ServerContext,
    job: ChatJob,
    index: int,
    choice: HarmonyOutput,
    output: RequestOutput | None,
) -> dict[str, Any]:
    tool_calls = [
        {
            "id": call.call_id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.text},
        }
        for call in choice.tool_calls
    ]
    content = choice.content_text
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content if content or not tool_calls else None,
        "reasoning_content": choice.reasoning_text or None,
        "reasoning": choice.reasoning_text or None,
        "tool_calls": tool_calls,
    }
    logprobs = None
    if job.top_logprobs is not None:
        entries = chat_logprob_entries(
            ctx.engine.tokenizer, choice.content_logprobs, job.top_logprobs
        )
        logprobs = {"content": entries}
    return {
        "index": index,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": finish_reason(output, choice) if output else "stop",
        "stop_reason": output.stop_reason if output else None,
    }


# -- streaming ------------------------------------------------------------------------------------


class _ChunkWriter:
    """Builds `chat.completion.chunk` events for one request."""

    def __init__(self, ctx: ServerContext, job: ChatJob) -> None:
        self.ctx = ctx
        self.job = job
        self.include_usage = bool(job.body.stream_options and job.body.stream_options.include_usage)
        self._items_started: dict[tuple[int, str], int] = {}

    def chunk(
        self,
        index: int,
        delta: dict[str, Any],
        logprobs: list[dict[str, Any]] | None = None,
        finish: str | None = None,
        stop_reason: int | str | None = None,
    ) -> str:
        choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None}
        if logprobs is not None:
            choice["logprobs"] = {"content": logprobs}
        choice["finish_reason"] = finish
        if finish is not None:
            choice["stop_reason"] = stop_reason
        return self._event([choice])

    def usage_chunk(self, usage: dict[str, Any]) -> str:
        return self._event([], usage)

    def _event(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> str:
        payload: dict[str, Any] = {
            "id": self.job.run.request_id,
            "object": "chat.completion.chunk",
            "created": self.job.created,
            "model": self.job.model,
            "choices": choices,
        }
        if self.include_usage:
            payload["usage"] = usage
        return sse_data(payload)

    def deltas(self, index: int, events: list[ItemEvent]) -> list[str]:
        """Chunks for one update of one choice; adjacent deltas of one field are merged."""
        pieces: list[_Piece] = []
        for event in events:
            piece = self._piece(index, event)
            if piece is None:
                continue
            if pieces and pieces[-1].key == piece.key and piece.key[0] != "call":
                pieces[-1].merge(piece)
            else:
                pieces.append(piece)
        return [self.chunk(index, piece.delta, self._logprobs(piece)) for piece in pieces]

    def _logprobs(self, piece: _Piece) -> list[dict[str, Any]] | None:
        if self.job.top_logprobs is None or piece.key[0] != "content":
            return None
        tokenizer = self.ctx.engine.tokenizer
        return chat_logprob_entries(tokenizer, piece.logprobs, self.job.top_logprobs)

    def _piece(self, index: int, event: ItemEvent) -> _Piece | None:
        if isinstance(event, ItemStart):
            return self._start_piece(index, event)
        if not isinstance(event, ItemDelta):
            return None
        if event.kind == REASONING:
            return _Piece(("reasoning",), _reasoning_delta(event.text))
        if event.kind == MESSAGE:
            return _Piece(("content",), {"content": event.text}, list(event.logprobs))
        call = {"index": event.tool_index, "function": {"arguments": event.text}}
        return _Piece(("args", event.tool_index), {"tool_calls": [call]})

    def _start_piece(self, index: int, event: ItemStart) -> _Piece | None:
        if event.kind == FUNCTION_CALL:
            call = {
                "index": event.tool_index,
                "id": event.call_id,
                "type": "function",
                "function": {"name": event.name, "arguments": ""},
            }
            return _Piece(("call", event.tool_index), {"tool_calls": [call]})
        # a second item of a kind: the separator the non-streaming answer joins items with
        seen = self._items_started.get((index, event.kind), 0)
        self._items_started[(index, event.kind)] = seen + 1
        if seen == 0:
            return None
        if event.kind == REASONING:
            return _Piece(("reasoning",), _reasoning_delta(ITEM_SEPARATOR))
        return _Piece(("content",), {"content": ITEM_SEPARATOR})


@dataclass
class _Piece:
    """One delta field of a chunk: key says which (merging only joins equal keys)."""

    key: tuple[Any, ...]
    delta: dict[str, Any]
    logprobs: list[TokenLogprobs] = field(default_factory=list)

    def merge(self, other: _Piece) -> None:
        if "tool_calls" in other.delta:
            function = self.delta["tool_calls"][0]["function"]
            function["arguments"] += other.delta["tool_calls"][0]["function"]["arguments"]
        else:
            for name, text in other.delta.items():
                self.delta[name] += text
        self.logprobs.extend(other.logprobs)


def _reasoning_delta(text: str) -> dict[str, Any]:
    return {"reasoning_content": text, "reasoning": text}


async def stream_chat(ctx: ServerContext, job: ChatJob) -> AsyncIterator[str]:
    writer = _ChunkWriter(ctx, job)
    choices = {index: job.new_choice(ctx) for index in range(job.run.params.n)}
    try:
        for index in choices:
            yield writer.chunk(index, {"role": "assistant", "content": ""})
        async for _, output in merged_outputs([job.run]):
            choice = choices[output.index]
            events = choice.add(output.new_token_ids, output.new_logprobs)
            if output.finished:
                events += choice.finish()
            for chunk in writer.deltas(output.index, events):
                yield chunk
            if output.finished:
                reason = finish_reason(output, choice)
                yield writer.chunk(output.index, {}, finish=reason, stop_reason=output.stop_reason)
        if writer.include_usage:
            yield writer.usage_chunk(usage_of(job, choices))
    except Exception as error:
        yield sse_data(as_api_error(error).body())
    finally:
        await job.run.close()
        _record_anomalies(ctx, choices)
    yield DONE
