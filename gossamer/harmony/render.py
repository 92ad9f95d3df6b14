"""OpenAI chat-completions messages -> Harmony prompt token ids for GPT-OSS.

The mapping (the same choices as vLLM's GPT-OSS chat path, made explicit):

- A system message is always first: model identity, knowledge cutoff, optional current date,
  `Reasoning: low|medium|high`, the valid channels, and the note that function calls go to the
  commentary channel when `tools` is non-empty.
- The OpenAI `system`/`developer` messages at the start of the list become the Harmony
  developer message's `# Instructions` (joined by a blank line); the `tools` become its
  `# Tools` section. No instructions and no tools: no developer message. A `system`/`developer`
  message later in the list becomes a developer message with instructions at that point.
- `user` -> a user message (text parts only; a `name` field is ignored).
- `assistant`: `reasoning_content` (or `reasoning`) -> an `analysis` message; with
  `tool_calls`, any `content` is a `commentary` preamble and each call is
  `assistant to=functions.NAME <|channel|>commentary <|constrain|>json` ending in `<|call|>`;
  without `tool_calls`, `content` is the `final` message.
- `tool` -> `functions.NAME to=assistant` on `commentary`; NAME is the message's `name`, or
  the name of the call whose id is its `tool_call_id`.
- Analysis from finished turns is dropped: every `analysis` message before the last assistant
  `final` message (the Harmony format guide: CoT is kept only while a tool-calling turn is
  still open). openai-harmony 0.0.8's own auto-drop only removes analysis before the *first*
  final message, and nothing at all when the last assistant message is a tool call; see
  tests/harmony/test_render.py.
- The prompt ends with `<|start|>assistant`, so the model writes the header's channel next.

Token-level layout follows openai-harmony exactly (each header piece is tokenized on its own).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gossamer.harmony.format_tokens import CONSTRAIN, FormatTokenIds
from gossamer.harmony.prompt_text import (
    DEFAULT_KNOWLEDGE_CUTOFF,
    DEFAULT_MODEL_IDENTITY,
    DEFAULT_REASONING_EFFORT,
    FUNCTIONS_NAMESPACE,
    REASONING_EFFORTS,
    FunctionTool,
    developer_message_text,
    system_message_text,
)
from gossamer.tokenizer import Tokenizer

TOOL_CALL_CONTENT_TYPE = f"{CONSTRAIN}json"
TEXT_PART_TYPES = ("text", "input_text", "output_text")


class ChatFormatError(ValueError):
    """A chat request that cannot be rendered as Harmony (bad roles, tools or content)."""


@dataclass(frozen=True)
class RenderOptions:
    """System-message fields; None leaves a line out."""

    model_identity: str | None = DEFAULT_MODEL_IDENTITY
    knowledge_cutoff: str | None = DEFAULT_KNOWLEDGE_CUTOFF
    conversation_start_date: str | None = None  # e.g. "2025-06-28"; a server passes today


@dataclass(frozen=True)
class HarmonyMessage:
    """One Harmony message: `<|start|>{header}<|message|>{text}<|end|>`."""

    role: str  # system | developer | user | assistant | tool
    text: str
    author_name: str | None = None  # tool messages: "functions.NAME"
    channel: str | None = None
    recipient: str | None = None
    content_type: str | None = None


def render_chat(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any] | FunctionTool] | None = None,
    reasoning_effort: str | None = None,
    options: RenderOptions = RenderOptions(),
) -> list[int]:
    """Prompt token ids for the next assistant turn (ends with `<|start|>assistant`)."""
    harmony = harmony_messages_from_chat(messages, tools, reasoning_effort, options)
    return render_for_completion(tokenizer, harmony)


def render_for_completion(tokenizer: Tokenizer, messages: Iterable[HarmonyMessage]) -> list[int]:
    format_ids = FormatTokenIds.from_tokenizer(tokenizer)
    ids = [token for message in messages for token in render_message(tokenizer, message)]
    return [*ids, format_ids.start, *tokenizer.encode("assistant")]


def render_message(tokenizer: Tokenizer, message: HarmonyMessage) -> list[int]:
    """`<|start|>role[ to=R][<|channel|>C][ type]<|message|>text<|end|>` (`<|call|>` for an
    assistant message with a recipient)."""
    format_ids = FormatTokenIds.from_tokenizer(tokenizer)
    ids = [format_ids.start, *tokenizer.encode(_author_text(message))]
    if message.recipient and message.recipient != "all":
        ids += tokenizer.encode(f" to={message.recipient}")
    if message.channel:
        ids += [format_ids.channel, *tokenizer.encode(message.channel)]
    if message.content_type:
        ids += _content_type_ids(tokenizer, format_ids, message.content_type)
    ids += [format_ids.message, *tokenizer.encode(message.text)]
    calls_tool = message.role == "assistant" and message.recipient is not None
    ids.append(format_ids.call if calls_tool else format_ids.end)
    return ids


def _author_text(message: HarmonyMessage) -> str:
    if message.role != "tool":
        return message.role
    if not message.author_name:
        raise ChatFormatError("a Harmony tool message needs the tool's name")
    return message.author_name


def _content_type_ids(
    tokenizer: Tokenizer, format_ids: FormatTokenIds, content_type: str
) -> list[int]:
    """` <|constrain|>json`: the constrain marker is the special token, not its text."""
    if not content_type.startswith(CONSTRAIN):
        return tokenizer.encode(f" {content_type}")
    rest = content_type.removeprefix(CONSTRAIN)
    return [*tokenizer.encode(" "), format_ids.constrain, *tokenizer.encode(rest)]


# ---------------------------------------------------------------------------------------------
# OpenAI chat messages -> Harmony messages
# ---------------------------------------------------------------------------------------------


def harmony_messages_from_chat(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any] | FunctionTool] | None = None,
    reasoning_effort: str | None = None,
    options: RenderOptions = RenderOptions(),
) -> list[HarmonyMessage]:
    """The Harmony messages for a chat request, finished turns' analysis already dropped."""
    function_tools = parse_tools(tools)
    chat = [_as_dict(message) for message in messages]
    instructions, rest = _leading_instructions(chat)
    harmony = [_system_message(options, reasoning_effort, bool(function_tools))]
    if instructions is not None or function_tools:
        harmony.append(
            HarmonyMessage("developer", developer_message_text(instructions, function_tools))
        )
    tool_names: dict[str, str] = {}
    for message in rest:
        harmony.extend(_convert_message(message, tool_names))
    return drop_finished_analysis(harmony)


def drop_finished_analysis(messages: Sequence[HarmonyMessage]) -> list[HarmonyMessage]:
    """Drop every analysis message that comes before the last assistant final message."""
    final_indices = [
        index
        for index, message in enumerate(messages)
        if message.role == "assistant" and message.channel == "final"
    ]
    last_final = final_indices[-1] if final_indices else -1
    return [
        message
        for index, message in enumerate(messages)
        if not (index < last_final and message.channel == "analysis")
    ]


def _system_message(
    options: RenderOptions, reasoning_effort: str | None, has_tools: bool
) -> HarmonyMessage:
    text = system_message_text(
        options.model_identity,
        options.knowledge_cutoff,
        options.conversation_start_date,
        _reasoning_effort(reasoning_effort),
        has_tools,
    )
    return HarmonyMessage("system", text)


def _reasoning_effort(effort: str | None) -> str:
    if effort is None:
        return DEFAULT_REASONING_EFFORT
    if effort.lower() not in REASONING_EFFORTS:
        raise ChatFormatError(
            f"reasoning_effort {effort!r} is not supported; "
            f"use one of {', '.join(REASONING_EFFORTS)}"
        )
    return effort.lower()


def _leading_instructions(
    chat: list[dict[str, Any]],
) -> tuple[str | None, list[dict[str, Any]]]:
    """Text of the system/developer messages that open the chat, and the messages after them."""
    count = 0
    while count < len(chat) and chat[count].get("role") in ("system", "developer"):
        count += 1
    if count == 0:
        return None, chat
    texts = [_text_content(message.get("content")) for message in chat[:count]]
    return "\n\n".join(texts), chat[count:]


def _convert_message(message: dict[str, Any], tool_names: dict[str, str]) -> list[HarmonyMessage]:
    converter = _CONVERTERS.get(message.get("role"))  # type: ignore[arg-type]
    if converter is None:
        raise ChatFormatError(
            f"unknown message role {message.get('role')!r}; use system, developer, user, "
            "assistant or tool"
        )
    return converter(message, tool_names)


def _instructions_message(message: dict[str, Any], _: dict[str, str]) -> list[HarmonyMessage]:
    text = developer_message_text(_text_content(message.get("content")), [])
    return [HarmonyMessage("developer", text)]


def _user_message(message: dict[str, Any], _: dict[str, str]) -> list[HarmonyMessage]:
    return [HarmonyMessage("user", _text_content(message.get("content")))]


def _assistant_messages(
    message: dict[str, Any], tool_names: dict[str, str]
) -> list[HarmonyMessage]:
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    harmony = [HarmonyMessage("assistant", reasoning, channel="analysis")] if reasoning else []
    content = _text_content(message.get("content"))
    tool_calls = message.get("tool_calls") or []
    if tool_calls:
        if content:
            harmony.append(HarmonyMessage("assistant", content, channel="commentary"))
        harmony.extend(_tool_call_message(call, tool_names) for call in tool_calls)
    elif content or not reasoning:
        harmony.append(HarmonyMessage("assistant", content, channel="final"))
    return harmony


def _tool_call_message(call: Mapping[str, Any], tool_names: dict[str, str]) -> HarmonyMessage:
    call = _as_dict(call)
    function = call.get("function")
    if call.get("type", "function") != "function" or not isinstance(function, Mapping):
        raise ChatFormatError(
            "an assistant tool call must be {'type': 'function', 'function': {...}}"
        )
    name = _required_name(function, "tool call")
    if call.get("id"):
        tool_names[call["id"]] = name
    arguments = function.get("arguments") or ""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return HarmonyMessage(
        "assistant",
        arguments,
        channel="commentary",
        recipient=f"{FUNCTIONS_NAMESPACE}.{name}",
        content_type=TOOL_CALL_CONTENT_TYPE,
    )


def _tool_result_message(
    message: dict[str, Any], tool_names: dict[str, str]
) -> list[HarmonyMessage]:
    name = message.get("name") or tool_names.get(message.get("tool_call_id") or "")
    if not name:
        raise ChatFormatError(
            "a tool message needs a 'name', or a 'tool_call_id' that matches an earlier "
            "assistant tool call"
        )
    return [
        HarmonyMessage(
            "tool",
            _text_content(message.get("content")),
            author_name=f"{FUNCTIONS_NAMESPACE}.{name}",
            channel="commentary",
            recipient="assistant",
        )
    ]


_CONVERTERS: dict[str, Callable[[dict[str, Any], dict[str, str]], list[HarmonyMessage]]] = {
    "system": _instructions_message,
    "developer": _instructions_message,
    "user": _user_message,
    "assistant": _assistant_messages,
    "tool": _tool_result_message,
}


def _text_content(content: Any) -> str:
    """A message's text: a string, or the concatenated text parts of a content list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, Sequence):
        raise ChatFormatError(
            f"message content must be a string or a list of parts, not {content!r}"
        )
    return "".join(_text_part(part) for part in content)


def _text_part(part: Any) -> str:
    part = _as_dict(part)
    if part.get("type") not in TEXT_PART_TYPES or not isinstance(part.get("text"), str):
        raise ChatFormatError(
            f"content part of type {part.get('type')!r} is not supported; GPT-OSS reads text only"
        )
    return part["text"]


def parse_tools(tools: Sequence[Mapping[str, Any] | FunctionTool] | None) -> list[FunctionTool]:
    """OpenAI `tools` ([{'type': 'function', 'function': {...}}]) -> FunctionTool list."""
    return [
        tool if isinstance(tool, FunctionTool) else _function_tool(tool) for tool in tools or []
    ]


def _function_tool(tool: Mapping[str, Any]) -> FunctionTool:
    tool = _as_dict(tool)
    function = tool.get("function")
    if tool.get("type") != "function" or not isinstance(function, Mapping):
        raise ChatFormatError(
            f"tool {tool!r} is not supported; give {{'type': 'function', 'function': {{...}}}}"
        )
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, Mapping):
        raise ChatFormatError(f"parameters of tool {function.get('name')!r} must be a JSON schema")
    return FunctionTool(
        name=_required_name(function, "tool"),
        description=function.get("description") or "",
        parameters=dict(parameters) if parameters is not None else None,
    )


def _required_name(function: Mapping[str, Any], what: str) -> str:
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ChatFormatError(f"a {what} needs a function 'name'")
    return name


def _as_dict(item: Any) -> dict[str, Any]:
    """Accept plain dicts and pydantic models (a server's request objects)."""
    if hasattr(item, "model_dump"):
        return item.model_dump(exclude_none=True)
    if not isinstance(item, Mapping):
        raise ChatFormatError(f"expected a JSON object, got {item!r}")
    return dict(item)
