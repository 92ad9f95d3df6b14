"""The Harmony chat format of GPT-OSS: render chat requests to prompt ids (render.py), parse
completion ids back into channels and tool calls while streaming (parser.py)."""

from gossamer.harmony.parser import (
    Anomaly,
    HarmonyStreamParser,
    MessageEnd,
    MessageStart,
    ParsedCompletion,
    ParsedMessage,
    Stop,
    TextDelta,
    ToolCall,
    parse_completion,
)
from gossamer.harmony.prompt_text import FunctionTool
from gossamer.harmony.render import (
    ChatFormatError,
    HarmonyMessage,
    RenderOptions,
    harmony_messages_from_chat,
    render_chat,
)

__all__ = [
    "Anomaly",
    "ChatFormatError",
    "FunctionTool",
    "HarmonyMessage",
    "HarmonyStreamParser",
    "MessageEnd",
    "MessageStart",
    "ParsedCompletion",
    "ParsedMessage",
    "RenderOptions",
    "Stop",
    "TextDelta",
    "ToolCall",
    "harmony_messages_from_chat",
    "parse_completion",
    "render_chat",
]
