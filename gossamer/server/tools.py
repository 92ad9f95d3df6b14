"""Function tools: validation of the schemas a client sends, and what `tool_choice` enforces.

`tool_choice` is enforced by prefilling the assistant header (see
`harmony_output.forced_tool_prefix`), because GPT-OSS writes the recipient in its header:

- `none`: no tools are rendered into the prompt, so the model does not know of any;
- `auto` (default): tools rendered, the model decides;
- `required`: tools rendered, the turn is prefilled with `<|channel|>commentary to=functions`,
  so the first message must be a call to some function (the model picks which);
- a named function: prefilled up to `to=functions.NAME`, so that exact function is called.

With `required` or a named function the model skips its analysis message for the turn.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gossamer.server.errors import bad_request
from gossamer.server.harmony_output import forced_tool_prefix
from gossamer.tokenizer import Tokenizer

FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class FunctionSpec:
    name: str
    description: str | None
    parameters: dict[str, Any] | None

    def as_chat_tool(self) -> dict[str, Any]:
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        if self.parameters is not None:
            function["parameters"] = self.parameters
        return {"type": "function", "function": function}


def check_function(spec: FunctionSpec, param: str) -> None:
    if not FUNCTION_NAME.match(spec.name):
        raise bad_request(
            f"Invalid function name {spec.name!r}: use 1-64 letters, digits, '_' or '-'.",
            param=param,
        )
    schema = spec.parameters
    if schema is None:
        return
    if schema.get("type", "object") != "object":
        raise bad_request(
            f"Invalid schema for function {spec.name!r}: parameters must be a JSON Schema of "
            f"type 'object', got type {schema.get('type')!r}.",
            param=param,
        )
    properties = schema.get("properties")
    if properties is not None and not (
        isinstance(properties, dict) and all(isinstance(v, dict) for v in properties.values())
    ):
        raise bad_request(
            f"Invalid schema for function {spec.name!r}: 'properties' must map names to schemas.",
            param=param,
        )
    required = schema.get("required")
    if required is not None and not (
        isinstance(required, list) and all(isinstance(name, str) for name in required)
    ):
        raise bad_request(
            f"Invalid schema for function {spec.name!r}: 'required' must be a list of names.",
            param=param,
        )


@dataclass(frozen=True)
class ToolPlan:
    """What to render and what to prefill for one request."""

    tools: list[dict[str, Any]] | None  # chat-format tools for the renderer
    prefill_ids: list[int]


def plan_tools(
    tokenizer: Tokenizer,
    functions: Sequence[FunctionSpec],
    choice: str | None,
    named: str | None,
    param: str,
) -> ToolPlan:
    """`choice`: "none" | "auto" | "required" | None; `named`: the forced function's name."""
    for position, spec in enumerate(functions):
        check_function(spec, f"{param}[{position}]")
    names = {spec.name for spec in functions}
    tools = [spec.as_chat_tool() for spec in functions] or None
    if named is not None:
        if named not in names:
            raise bad_request(
                f"tool_choice names function {named!r}, which is not in 'tools'.",
                param="tool_choice",
            )
        return ToolPlan(tools, forced_tool_prefix(tokenizer, named))
    if choice == "none":
        return ToolPlan(None, [])
    if choice == "required":
        if not tools:
            raise bad_request(
                "tool_choice 'required' needs at least one tool in 'tools'.", param="tool_choice"
            )
        return ToolPlan(tools, forced_tool_prefix(tokenizer, None))
    return ToolPlan(tools, [])
