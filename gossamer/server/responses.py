"""`POST /v1/responses` (and `GET /v1/responses/{id}`): the Responses API over Harmony.

`input` (a string or items: messages with input_text/output_text parts, `function_call`,
`function_call_output`, `reasoning`) and `instructions` become chat messages for the Harmony
renderer; the completion's items come back as `reasoning`, `message` (output_text) and
`function_call` output items. `previous_response_id` continues a stored conversation (its
instructions are not carried over, as in OpenAI's API). Responses are kept in a bounded
in-memory LRU store unless `store: false`.

Streaming sends the Responses event types the `openai` client parses: response.created,
response.in_progress, then per item output_item.added, content_part.added (reasoning_text or
output_text), reasoning_text.delta / output_text.delta / function_call_arguments.delta, the
matching .done events, content_part.done, output_item.done, and finally response.completed
(response.incomplete when max_output_tokens cut it; `error` + response.failed on failure).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from gossamer.engine.outputs import RequestOutput
from gossamer.server.context import ServerContext, build_sampling_params, resolve_max_tokens
from gossamer.server.errors import ApiError, as_api_error, bad_request
from gossamer.server.generation import EngineRun, merged_outputs
from gossamer.server.harmony_output import (
    FUNCTION_CALL,
    MESSAGE,
    REASONING,
    HarmonyOutput,
    ItemDelta,
    ItemDone,
    ItemEvent,
    ItemStart,
    OutputItem,
    harmony_stop_token_ids,
    random_id,
    render_prompt,
)
from gossamer.server.protocol import ResponsesNamedToolChoice, ResponsesRequest
from gossamer.server.streaming import (
    CLIENT_CLOSED,
    EventStreamResponse,
    cancel_on_disconnect,
    sse_data,
)
from gossamer.server.tools import FunctionSpec, ToolPlan, plan_tools

ENDPOINT = "/v1/responses"
DEFAULT_STORE_SIZE = 1000
_ITEM_ID_PREFIX = {REASONING: "rs_", MESSAGE: "msg_", FUNCTION_CALL: "fc_"}


@dataclass
class StoredResponse:
    response: dict[str, Any]
    messages: list[dict[str, Any]]  # the conversation so far, as chat messages, sans instructions


class ResponseStore:
    """Bounded LRU of responses, for previous_response_id and GET /v1/responses/{id}."""

    def __init__(self, capacity: int = DEFAULT_STORE_SIZE) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()

    def put(self, response_id: str, stored: StoredResponse) -> None:
        self._items[response_id] = stored
        self._items.move_to_end(response_id)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        stored = self._items.get(response_id)
        if stored is not None:
            self._items.move_to_end(response_id)
        return stored

    def __len__(self) -> int:
        return len(self._items)


@dataclass
class ResponsesJob:
    body: ResponsesRequest
    model: str
    response_id: str
    run: EngineRun
    plan: ToolPlan
    conversation: list[dict[str, Any]]  # prior + new input messages, sans instructions
    created: int
    item_ids: dict[int, str] = field(default_factory=dict)

    def item_id(self, item: int, kind: str) -> str:
        if item not in self.item_ids:
            self.item_ids[item] = random_id(_ITEM_ID_PREFIX[kind], 32)
        return self.item_ids[item]


async def create_response(
    ctx: ServerContext, store: ResponseStore, request: Request, body: ResponsesRequest
) -> Response:
    ctx.check_ready()
    # Rendering and tokenizing a long prompt takes milliseconds: off the event loop, so
    # streams in flight keep flowing.
    prior = previous_messages(store, body)  # the store is only touched on the event loop
    job = await asyncio.to_thread(prepare_response, ctx, prior, body)

    if await cancel_on_disconnect(request, job.run.start) is None:
        await job.run.close()
        return Response(status_code=CLIENT_CLOSED)
    if body.stream:
        return EventStreamResponse(stream_response(ctx, store, job))
    result = await cancel_on_disconnect(request, lambda: collect_response(ctx, store, job))
    return JSONResponse(result) if result is not None else Response(status_code=CLIENT_CLOSED)


def get_stored_response(store: ResponseStore, response_id: str) -> dict[str, Any]:
    stored = store.get(response_id)
    if stored is None:
        raise ApiError(404, f"Response with id '{response_id}' not found.", param="response_id")
    return stored.response


# -- request -> prompt ----------------------------------------------------------------------------


def previous_messages(store: ResponseStore, body: ResponsesRequest) -> list[dict[str, Any]]:
    """The stored conversation that `previous_response_id` continues ([] without one)."""
    if body.previous_response_id is None:
        return []
    stored = store.get(body.previous_response_id)
    if stored is None:
        raise ApiError(
            404,
            f"Previous response with id '{body.previous_response_id}' not found "
            "(it was never stored, was created with store=false, or was evicted).",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return stored.messages


def prepare_response(
    ctx: ServerContext, prior: list[dict[str, Any]], body: ResponsesRequest
) -> ResponsesJob:
    model = ctx.check_model(body.model)
    tokenizer = ctx.engine.tokenizer
    conversation = [*prior, *input_messages(body.input)]
    if not conversation:
        raise bad_request("'input' must not be empty.", param="input")
    instructions = [{"role": "system", "content": body.instructions}] if body.instructions else []
    plan = _tool_plan(ctx, body)
    effort = body.reasoning.effort if body.reasoning else None
    prompt_ids = render_prompt(tokenizer, [*instructions, *conversation], plan.tools, effort)
    prompt_ids += plan.prefill_ids
    max_tokens = resolve_max_tokens(
        body.max_output_tokens,
        "max_output_tokens",
        len(prompt_ids),
        ctx.engine.max_model_len,
        "input",
    )
    stop_ids = () if body.ignore_eos else harmony_stop_token_ids(tokenizer)
    params = build_sampling_params(
        body, n=1, max_tokens=max_tokens, stop_token_ids=stop_ids, logprobs=None
    )
    response_id = f"resp_{uuid.uuid4().hex}"
    run = EngineRun(
        ctx.engine, ctx.metrics, ENDPOINT, prompt_ids, params, response_id, body.cache_salt
    )
    return ResponsesJob(body, model, response_id, run, plan, conversation, int(time.time()))


def _tool_plan(ctx: ServerContext, body: ResponsesRequest) -> ToolPlan:
    functions = []
    for position, tool in enumerate(body.tools or []):
        if tool.type != "function" or not tool.name:
            raise bad_request(
                f"tool type {tool.type!r} is not supported; only 'function' tools with a name.",
                param=f"tools[{position}]",
            )
        functions.append(FunctionSpec(tool.name, tool.description, tool.parameters))
    choice = body.tool_choice
    named = choice.name if isinstance(choice, ResponsesNamedToolChoice) else None
    plain = choice if isinstance(choice, str) else None
    return plan_tools(ctx.engine.tokenizer, functions, plain, named, "tools")


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses `input` -> chat messages for the Harmony renderer."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    return [_input_item_message(item, position) for position, item in enumerate(items)]


def _input_item_message(item: dict[str, Any], position: int) -> dict[str, Any]:
    kind = item.get("type", "message" if "role" in item else None)
    param = f"input[{position}]"
    if kind == "message":
        if item.get("role") not in ("user", "system", "developer", "assistant"):
            raise bad_request(f"unsupported message role {item.get('role')!r}.", param=param)
        return {"role": item["role"], "content": item.get("content")}
    if kind == "function_call":
        call = {"name": _required(item, "name", param), "arguments": item.get("arguments") or ""}
        call_id = _required(item, "call_id", param)
        return {
            "role": "assistant",
            "tool_calls": [{"id": call_id, "type": "function", "function": call}],
        }
    if kind == "function_call_output":
        output = item.get("output")
        return {
            "role": "tool",
            "tool_call_id": _required(item, "call_id", param),
            "content": output,
        }
    if kind == "reasoning":
        parts = item.get("content") or item.get("summary") or []
        text = "".join(part.get("text", "") for part in parts if isinstance(part, dict))
        return {"role": "assistant", "reasoning_content": text}
    raise bad_request(
        f"input item type {kind!r} is not supported; use message, function_call, "
        "function_call_output or reasoning.",
        param=param,
    )


def _required(item: dict[str, Any], key: str, param: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise bad_request(f"'{key}' is required in this input item.", param=f"{param}.{key}")
    return value


# -- completion -> output items ---------------------------------------------------------------------


def _output_item(job: ResponsesJob, index: int, item: OutputItem, status: str) -> dict[str, Any]:
    item_id = job.item_id(index, item.kind)
    text = item.text if status != "in_progress" else ""
    if item.kind == REASONING:
        content = [{"type": "reasoning_text", "text": text}]
        return {
            "id": item_id,
            "type": "reasoning",
            "summary": [],
            "content": content,
            "status": status,
        }
    if item.kind == FUNCTION_CALL:
        return {
            "id": item_id,
            "type": "function_call",
            "call_id": item.call_id,
            "name": item.name,
            "arguments": text,
            "status": status,
        }
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [_output_text(text)] if status != "in_progress" else [],
    }


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _output_messages(choice: HarmonyOutput) -> list[dict[str, Any]]:
    """The completion as chat messages, to continue the conversation from."""
    messages: list[dict[str, Any]] = []
    for item in choice.items:
        if item.kind == REASONING:
            messages.append({"role": "assistant", "reasoning_content": item.text})
        elif item.kind == FUNCTION_CALL:
            function = {"name": item.name, "arguments": item.text}
            call = {"id": item.call_id, "type": "function", "function": function}
            messages.append({"role": "assistant", "tool_calls": [call]})
        else:
            messages.append({"role": "assistant", "content": item.text})
    return messages


def _tools_echo(body: ResponsesRequest) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
            "strict": tool.strict if tool.strict is not None else False,
        }
        for tool in body.tools or []
    ]


def _response_object(
    job: ResponsesJob,
    status: str,
    output: list[dict[str, Any]],
    choice: HarmonyOutput | None = None,
    error: ApiError | None = None,
) -> dict[str, Any]:
    body = job.body
    choice_value = body.tool_choice
    tool_choice = (
        choice_value.model_dump()
        if isinstance(choice_value, ResponsesNamedToolChoice)
        else (choice_value or "auto")
    )
    usage = None
    if choice is not None:
        run_usage = job.run.usage
        usage = {
            "input_tokens": run_usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": run_usage.cached_tokens},
            "output_tokens": run_usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": choice.num_reasoning_tokens},
            "total_tokens": run_usage.prompt_tokens + run_usage.completion_tokens,
        }
    return {
        "id": job.response_id,
        "object": "response",
        "created_at": job.created,
        "status": status,
        "model": job.model,
        "output": output,
        "usage": usage,
        "error": {"code": error.code or "server_error", "message": error.message}
        if error
        else None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.instructions,
        "metadata": body.metadata,
        "parallel_tool_calls": body.parallel_tool_calls
        if body.parallel_tool_calls is not None
        else True,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": body.reasoning.effort if body.reasoning else None, "summary": None},
        "store": body.store,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "max_output_tokens": body.max_output_tokens,
        "text": {"format": {"type": "text"}},
        "tool_choice": tool_choice,
        "tools": _tools_echo(body),
        "truncation": "disabled",
        "user": body.user,
    }


def _final_status(output: RequestOutput | None) -> str:
    return "incomplete" if output is not None and output.finish_reason == "length" else "completed"


def _finish(
    ctx: ServerContext,
    store: ResponseStore,
    job: ResponsesJob,
    choice: HarmonyOutput,
    last: RequestOutput | None,
) -> dict[str, Any]:
    """The final response object; stored unless store=false."""
    output = [_output_item(job, i, item, "completed") for i, item in enumerate(choice.items)]
    response = _response_object(job, _final_status(last), output, choice)
    for kind, count in choice.anomalies.items():
        ctx.metrics.harmony_anomalies.labels(kind).inc(count)
    if job.body.store:
        messages = [*job.conversation, *_output_messages(choice)]
        store.put(job.response_id, StoredResponse(response, messages))
    return response


async def collect_response(
    ctx: ServerContext, store: ResponseStore, job: ResponsesJob
) -> dict[str, Any]:
    choice = _new_choice(ctx, job)
    last: RequestOutput | None = None
    try:
        async for _, output in merged_outputs([job.run]):
            choice.add(output.new_token_ids, output.new_logprobs)
            last = output
        choice.finish()
    finally:
        await job.run.close()
    return _finish(ctx, store, job, choice, last)


def _new_choice(ctx: ServerContext, job: ResponsesJob) -> HarmonyOutput:
    return HarmonyOutput(
        ctx.engine.tokenizer,
        prefill_ids=job.plan.prefill_ids,
        stop=job.run.params.stop,
        include_stop_str=job.body.include_stop_str_in_output,
    )


# -- streaming --------------------------------------------------------------------------------------


class _EventWriter:
    def __init__(self, job: ResponsesJob) -> None:
        self.job = job
        self.sequence_number = 0

    def event(self, event_type: str, **fields: Any) -> str:
        payload = {"type": event_type, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return sse_data(payload, event=event_type)

    def item_events(self, choice: HarmonyOutput, event: ItemEvent) -> list[str]:
        item = choice.items[event.item]
        item_id = self.job.item_id(event.item, event.kind)
        where = {"item_id": item_id, "output_index": event.item}
        if isinstance(event, ItemStart):
            return self._item_added(event.item, item, where)
        if isinstance(event, ItemDelta):
            return [self._delta(event, where)]
        if isinstance(event, ItemDone):
            return self._item_done(event, item, where)
        return []

    def _item_added(self, index: int, item: OutputItem, where: dict[str, Any]) -> list[str]:
        skeleton = _output_item(self.job, index, item, "in_progress")
        events = [self.event("response.output_item.added", output_index=index, item=skeleton)]
        part = _content_part(item.kind, "")
        if part is not None:
            events.append(
                self.event("response.content_part.added", **where, content_index=0, part=part)
            )
        return events

    def _delta(self, event: ItemDelta, where: dict[str, Any]) -> str:
        if event.kind == REASONING:
            return self.event(
                "response.reasoning_text.delta", **where, content_index=0, delta=event.text
            )
        if event.kind == FUNCTION_CALL:
            return self.event("response.function_call_arguments.delta", **where, delta=event.text)
        return self.event(
            "response.output_text.delta", **where, content_index=0, delta=event.text, logprobs=[]
        )

    def _item_done(self, event: ItemDone, item: OutputItem, where: dict[str, Any]) -> list[str]:
        events = []
        if event.kind == REASONING:
            events.append(
                self.event(
                    "response.reasoning_text.done", **where, content_index=0, text=event.text
                )
            )
        elif event.kind == MESSAGE:
            events.append(
                self.event(
                    "response.output_text.done",
                    **where,
                    content_index=0,
                    text=event.text,
                    logprobs=[],
                )
            )
        else:
            events.append(
                self.event(
                    "response.function_call_arguments.done",
                    **where,
                    name=event.name,
                    arguments=event.text,
                )
            )
        part = _content_part(event.kind, event.text)
        if part is not None:
            events.append(
                self.event("response.content_part.done", **where, content_index=0, part=part)
            )
        done_item = _output_item(self.job, event.item, item, "completed")
        events.append(
            self.event("response.output_item.done", output_index=event.item, item=done_item)
        )
        return events


def _content_part(kind: str, text: str) -> dict[str, Any] | None:
    if kind == REASONING:
        return {"type": "reasoning_text", "text": text}
    if kind == MESSAGE:
        return _output_text(text)
    return None


async def stream_response(
    ctx: ServerContext, store: ResponseStore, job: ResponsesJob
) -> AsyncIterator[str]:
    writer = _EventWriter(job)
    choice = _new_choice(ctx, job)
    last: RequestOutput | None = None
    try:
        yield writer.event("response.created", response=_response_object(job, "in_progress", []))
        yield writer.event(
            "response.in_progress", response=_response_object(job, "in_progress", [])
        )
        async for _, output in merged_outputs([job.run]):
            last = output
            for event in choice.add(output.new_token_ids, output.new_logprobs):
                for text in writer.item_events(choice, event):
                    yield text
        for event in choice.finish():
            for text in writer.item_events(choice, event):
                yield text
        response = _finish(ctx, store, job, choice, last)
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        yield writer.event(kind, response=response)
    except Exception as error:
        api_error = as_api_error(error)
        yield writer.event(
            "error", code=api_error.code, message=api_error.message, param=api_error.param
        )
        failed = _response_object(job, "failed", [], error=api_error)
        yield writer.event("response.failed", response=failed)
    finally:
        await job.run.close()
