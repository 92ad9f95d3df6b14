"""Every fixed piece of Harmony prompt text: the system message, the developer message and the
`namespace functions { ... }` tool block. Wording and blank lines follow openai-harmony exactly,
because GPT-OSS was trained on them; change nothing here without a token-for-token test.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gossamer.harmony.typescript import schema_to_typescript

DEFAULT_MODEL_IDENTITY = "You are ChatGPT, a large language model trained by OpenAI."
DEFAULT_KNOWLEDGE_CUTOFF = "2024-06"
REASONING_EFFORTS = ("low", "medium", "high")
DEFAULT_REASONING_EFFORT = "medium"
VALID_CHANNELS = ("analysis", "commentary", "final")
CHANNEL_REQUIRED_NOTE = "Channel must be included for every message."
FUNCTIONS_CHANNEL_NOTE = "Calls to these tools must go to the commentary channel: 'functions'."
FUNCTIONS_NAMESPACE = "functions"


@dataclass(frozen=True)
class FunctionTool:
    """One function the model may call; `parameters` is a JSON schema (None: no arguments)."""

    name: str
    description: str = ""
    parameters: dict[str, Any] | None = None


def system_message_text(
    model_identity: str | None,
    knowledge_cutoff: str | None,
    conversation_start_date: str | None,
    reasoning_effort: str,
    has_function_tools: bool,
) -> str:
    """Identity and dates, the reasoning effort, then the valid channels."""
    identity_lines = [
        *([model_identity] if model_identity else []),
        *([f"Knowledge cutoff: {knowledge_cutoff}"] if knowledge_cutoff else []),
        *([f"Current date: {conversation_start_date}"] if conversation_start_date else []),
    ]
    channels = f"# Valid channels: {', '.join(VALID_CHANNELS)}. {CHANNEL_REQUIRED_NOTE}"
    if has_function_tools:
        channels += f"\n{FUNCTIONS_CHANNEL_NOTE}"
    sections = [
        *(["\n".join(identity_lines)] if identity_lines else []),
        f"Reasoning: {reasoning_effort}",
        channels,
    ]
    return "\n\n".join(sections)


def developer_message_text(instructions: str | None, tools: Sequence[FunctionTool]) -> str:
    """`# Instructions` (the OpenAI system prompt), then `# Tools` with the functions namespace."""
    sections = ["# Instructions", instructions] if instructions is not None else []
    if tools:
        sections.append(f"# Tools\n\n{functions_namespace_text(tools)}")
    return "\n\n".join(sections)


def functions_namespace_text(tools: Sequence[FunctionTool]) -> str:
    """The `## functions` section: one TypeScript-like `type` per tool inside a namespace."""
    parts = [f"## {FUNCTIONS_NAMESPACE}\n", f"namespace {FUNCTIONS_NAMESPACE} {{\n"]
    for tool in tools:
        parts.extend(f"// {line}" for line in rust_lines(tool.description))
        parts.append(f"type {tool.name} = {_signature(tool.parameters)};\n")
    parts.append(f"}} // namespace {FUNCTIONS_NAMESPACE}")
    return "\n".join(parts)


def _signature(parameters: dict[str, Any] | None) -> str:
    if parameters is None:
        return "() => any"
    return f"(_: {schema_to_typescript(parameters)}) => any"


def rust_lines(text: str) -> list[str]:
    """Lines as Rust's str::lines() gives them (openai-harmony splits descriptions with it):
    split on "\\n" only, drop one trailing "\\r" per line, no empty line after a final "\\n"."""
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]
