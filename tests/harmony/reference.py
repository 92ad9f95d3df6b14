"""The reference side of the renderer tests: the same chat, built with openai-harmony's own
classes (SystemContent, DeveloperContent, ToolDescription, ...) and rendered by its Rust code.

It follows the mapping documented in gossamer/harmony/render.py, written against the
openai-harmony API rather than against our code.
"""

from __future__ import annotations

from typing import Any

import openai_harmony as oh

EFFORTS = {
    "low": oh.ReasoningEffort.LOW,
    "medium": oh.ReasoningEffort.MEDIUM,
    "high": oh.ReasoningEffort.HIGH,
}


def reference_messages(
    chat: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    reasoning_effort: str = "medium",
    date: str | None = None,
) -> list[oh.Message]:
    system = oh.SystemContent.new().with_reasoning_effort(EFFORTS[reasoning_effort])
    if date:
        system = system.with_conversation_start_date(date)
    messages = [oh.Message.from_role_and_content(oh.Role.SYSTEM, system)]
    lead = 0
    while lead < len(chat) and chat[lead]["role"] in ("system", "developer"):
        lead += 1
    developer = oh.DeveloperContent.new()
    if lead:
        developer = developer.with_instructions("\n\n".join(m["content"] for m in chat[:lead]))
    if tools:
        developer = developer.with_function_tools([_tool(t["function"]) for t in tools])
    if lead or tools:
        messages.append(oh.Message.from_role_and_content(oh.Role.DEVELOPER, developer))
    call_names: dict[str, str] = {}
    for message in chat[lead:]:
        messages.extend(_convert(message, call_names))
    return messages


def _tool(function: dict[str, Any]) -> oh.ToolDescription:
    return oh.ToolDescription.new(
        function["name"], function.get("description", ""), function.get("parameters")
    )


def _convert(message: dict[str, Any], call_names: dict[str, str]) -> list[oh.Message]:
    role = message["role"]
    if role in ("system", "developer"):
        content = oh.DeveloperContent.new().with_instructions(message["content"])
        return [oh.Message.from_role_and_content(oh.Role.DEVELOPER, content)]
    if role == "user":
        return [oh.Message.from_role_and_content(oh.Role.USER, _text(message["content"]))]
    if role == "tool":
        name = message.get("name") or call_names[message["tool_call_id"]]
        author = oh.Author.new(oh.Role.TOOL, f"functions.{name}")
        return [
            oh.Message.from_author_and_content(author, message["content"])
            .with_channel("commentary")
            .with_recipient("assistant")
        ]
    return _assistant(message, call_names)


def _assistant(message: dict[str, Any], call_names: dict[str, str]) -> list[oh.Message]:
    def say(text: str, channel: str) -> oh.Message:
        return oh.Message.from_role_and_content(oh.Role.ASSISTANT, text).with_channel(channel)

    out = []
    if message.get("reasoning_content"):
        out.append(say(message["reasoning_content"], "analysis"))
    content = _text(message.get("content"))
    if message.get("tool_calls"):
        if content:
            out.append(say(content, "commentary"))
        for call in message["tool_calls"]:
            call_names[call["id"]] = call["function"]["name"]
            out.append(
                say(call["function"]["arguments"], "commentary")
                .with_recipient(f"functions.{call['function']['name']}")
                .with_content_type("<|constrain|>json")
            )
    elif content or not message.get("reasoning_content"):
        out.append(say(content, "final"))
    return out


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part["text"] for part in content)


def drop_analysis_before_last_final(messages: list[oh.Message]) -> list[oh.Message]:
    """The Harmony guide's rule for earlier turns' chain of thought."""
    finals = [
        i
        for i, m in enumerate(messages)
        if m.author.role == oh.Role.ASSISTANT and m.channel == "final"
    ]
    last = finals[-1] if finals else -1
    return [m for i, m in enumerate(messages) if not (i < last and m.channel == "analysis")]


def render_reference(
    encoding: oh.HarmonyEncoding, messages: list[oh.Message], auto_drop_analysis: bool = True
) -> list[int]:
    config = oh.RenderConversationConfig(auto_drop_analysis=auto_drop_analysis)
    conversation = oh.Conversation.from_messages(messages)
    return encoding.render_conversation_for_completion(conversation, oh.Role.ASSISTANT, config)
