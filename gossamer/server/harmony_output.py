"""Adapter between the Harmony stream parser and the API layers.

One `HarmonyOutput` per choice turns completion token ids into *output items*, the shape that
both the Chat Completions and the Responses endpoints are built from:

- `reasoning`: an `analysis` message;
- `function_call`: an assistant message with a recipient (`to=functions.NAME`);
- `message`: everything else the user should read (`final`, commentary preambles, text the
  model wrote outside any header).

Events come out as `ItemStart` / `ItemDelta` / `ItemDone`, in order. Stop strings are applied
to `message` text here (holding back a possible stop-string prefix), because the API text comes
from the parser, not from the engine's plain `text_delta`.

This module is the only place the server touches `gossamer.harmony`'s parser and renderer.
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gossamer.harmony import (
    HarmonyStreamParser,
    MessageEnd,
    MessageStart,
    RenderOptions,
    Stop,
    TextDelta,
    render_chat,
)
from gossamer.harmony.format_tokens import CALL, CHANNEL, RETURN, FormatTokenIds
from gossamer.harmony.parser import ANALYSIS_CHANNEL, tool_name
from gossamer.runner.sampler import TokenLogprobs
from gossamer.tokenizer import Tokenizer

REASONING = "reasoning"
MESSAGE = "message"
FUNCTION_CALL = "function_call"
ITEM_SEPARATOR = "\n"  # between two items of the same kind when they are joined into one field

_ID_ALPHABET = string.ascii_letters + string.digits


def random_id(prefix: str, length: int = 24) -> str:
    return prefix + "".join(secrets.choice(_ID_ALPHABET) for _ in range(length))


def new_call_id() -> str:
    return random_id("call_")


# -- prompt side ---------------------------------------------------------------------------------


def render_prompt(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    reasoning_effort: str | None,
) -> list[int]:
    """Harmony prompt ids ending in `<|start|>assistant`; today's date goes into the system
    message, as the model was trained with one."""
    options = RenderOptions(conversation_start_date=datetime.now(UTC).strftime("%Y-%m-%d"))
    return render_chat(tokenizer, messages, tools or None, reasoning_effort, options)


def forced_tool_prefix(tokenizer: Tokenizer, function_name: str | None) -> list[int]:
    """Tokens appended after `<|start|>assistant` to force a tool call.

    Named function: `<|channel|>commentary to=functions.NAME`; the model continues with
    ` <|constrain|>json<|message|>{...}<|call|>`. Any function (`required`): the prefix stops
    at `to=functions`, which ends on a pre-token boundary of the o200k pattern (`.NAME` is a
    pre-token of its own), so the model's own spelling of the name is tokenized as it was
    trained. Either way the model skips its analysis message for this turn.
    """
    channel = tokenizer.special_id(CHANNEL)
    recipient = "functions" if function_name is None else f"functions.{function_name}"
    return [channel, *tokenizer.encode(f"commentary to={recipient}")]


def harmony_stop_token_ids(tokenizer: Tokenizer) -> tuple[int, ...]:
    return (tokenizer.special_id(RETURN), tokenizer.special_id(CALL))


# -- completion side -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ItemStart:
    item: int  # position among this choice's items
    kind: str  # REASONING | MESSAGE | FUNCTION_CALL
    tool_index: int | None = None  # function calls: 0, 1, ... within the choice
    name: str | None = None
    call_id: str | None = None


@dataclass(frozen=True)
class ItemDelta:
    item: int
    kind: str
    text: str
    tool_index: int | None = None
    logprobs: tuple[TokenLogprobs, ...] = ()  # message items only


@dataclass(frozen=True)
class ItemDone:
    item: int
    kind: str
    text: str
    tool_index: int | None = None
    name: str | None = None
    call_id: str | None = None


ItemEvent = ItemStart | ItemDelta | ItemDone


@dataclass
class OutputItem:
    kind: str
    tool_index: int | None = None
    name: str | None = None
    call_id: str | None = None
    text_parts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    done: bool = False

    @property
    def text(self) -> str:
        return "".join(self.text_parts)


class StopTrimmer:
    """Cuts message text at the first stop string, holding back a tail that could still grow
    into one, so a client never receives text that is later cut."""

    def __init__(self, stop: Sequence[str], include_stop: bool = False) -> None:
        self._stop = tuple(s for s in stop if s)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._include_stop = include_stop
        self._buffer = ""
        self.stopped = False

    def push(self, text: str) -> str:
        if self.stopped:
            return ""
        if not self._stop:
            return text
        buffer = self._buffer + text
        hits = [(buffer.find(s), s) for s in self._stop if s in buffer]
        if hits:
            at, stop = min(hits)
            self.stopped, self._buffer = True, ""
            return buffer[: at + len(stop)] if self._include_stop else buffer[:at]
        keep_from = max(0, len(buffer) - self._hold)
        self._buffer = buffer[keep_from:]
        return buffer[:keep_from]

    def flush(self) -> str:
        text, self._buffer = self._buffer, ""
        return text


def item_kind(channel: str | None, recipient: str | None) -> str:
    if recipient is not None and recipient != "assistant":
        return FUNCTION_CALL
    if channel == ANALYSIS_CHANNEL:
        return REASONING
    return MESSAGE


class HarmonyOutput:
    """One choice: completion token ids in, output item events out."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        prefill_ids: Sequence[int] = (),
        stop: Sequence[str] = (),
        include_stop_str: bool = False,
        call_id_factory: Callable[[], str] = new_call_id,
    ) -> None:
        self._tokenizer = tokenizer
        self._parser = HarmonyStreamParser(tokenizer)
        self._parser.feed_many(prefill_ids)  # a forced header: parsed, never shown
        self._call_token = FormatTokenIds.from_tokenizer(tokenizer).call
        self._trimmer = StopTrimmer(stop, include_stop_str)
        self._new_call_id = call_id_factory
        self._open: OutputItem | None = None
        self._pending_logprobs: list[TokenLogprobs] = []
        self.items: list[OutputItem] = []
        self.num_reasoning_tokens = 0
        self.stop_token_id: int | None = None

    # -- feeding ------------------------------------------------------------------------------

    def add(
        self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprobs | None] = ()
    ) -> list[ItemEvent]:
        events: list[ItemEvent] = []
        for position, token_id in enumerate(token_ids):
            logprob = logprobs[position] if position < len(logprobs) else None
            events += self._add_token(token_id, logprob)
        return events

    def finish(self) -> list[ItemEvent]:
        """End of the completion (any reason): close what is open."""
        return self._translate(self._parser.finish())

    def _add_token(self, token_id: int, logprob: TokenLogprobs | None) -> list[ItemEvent]:
        in_reasoning = self._open is not None and self._open.kind == REASONING
        parser_events = self._parser.feed(token_id)
        if in_reasoning or self._parser.current_channel == ANALYSIS_CHANNEL:
            self.num_reasoning_tokens += 1
        is_text = not self._tokenizer.is_special(token_id)
        events: list[ItemEvent] = []
        for parser_event in parser_events:
            if logprob is not None and is_text and isinstance(parser_event, TextDelta):
                if self._open is not None and self._open.kind == MESSAGE:
                    self._pending_logprobs.append(logprob)
                logprob = None
            events += self._translate([parser_event])
        if logprob is not None and is_text and self._open is not None:
            if self._open.kind == MESSAGE:  # part of a character: its text comes later
                self._pending_logprobs.append(logprob)
        return events

    # -- parser events -> item events ----------------------------------------------------------

    def _translate(self, parser_events: Sequence[object]) -> list[ItemEvent]:
        events: list[ItemEvent] = []
        for event in parser_events:
            if isinstance(event, MessageStart):
                events += self._start_item(event)
            elif isinstance(event, TextDelta):
                events += self._delta(event.text)
            elif isinstance(event, MessageEnd):
                events += self._end_item()
            elif isinstance(event, Stop):
                self.stop_token_id = event.token_id
            # Anomaly: text outside any message is dropped; the parser counts it.
        return events

    def _start_item(self, start: MessageStart) -> list[ItemEvent]:
        kind = item_kind(start.channel, start.recipient)
        if kind == MESSAGE and self._trimmer.stopped:
            self._open = None  # a stop string already ended the visible text
            return []
        item = OutputItem(kind)
        if kind == FUNCTION_CALL:
            item.tool_index = sum(1 for other in self.items if other.kind == FUNCTION_CALL)
            item.name = tool_name(start.recipient or "")
            item.call_id = self._new_call_id()
        self.items.append(item)
        self._open = item
        return [ItemStart(len(self.items) - 1, kind, item.tool_index, item.name, item.call_id)]

    def _delta(self, text: str) -> list[ItemEvent]:
        item = self._open
        if item is None:
            return []
        if item.kind == MESSAGE:
            text = self._trimmer.push(text)
        return self._emit(item, text)

    def _emit(self, item: OutputItem, text: str) -> list[ItemEvent]:
        logprobs = tuple(self._pending_logprobs) if item.kind == MESSAGE else ()
        self._pending_logprobs.clear()
        if not text and not logprobs:
            return []
        item.text_parts.append(text)
        item.logprobs.extend(logprobs)
        return [ItemDelta(len(self.items) - 1, item.kind, text, item.tool_index, logprobs)]

    def _end_item(self) -> list[ItemEvent]:
        item, self._open = self._open, None
        if item is None:
            return []
        events = self._emit(item, self._trimmer.flush()) if item.kind == MESSAGE else []
        item.done = True
        index = self.items.index(item)
        return [
            *events,
            ItemDone(index, item.kind, item.text, item.tool_index, item.name, item.call_id),
        ]

    # -- results --------------------------------------------------------------------------------

    @property
    def stopped(self) -> bool:
        """The model ended its turn (`<|return|>`/`<|call|>`) or a stop string cut the text."""
        return self.stop_token_id is not None or self._trimmer.stopped

    @property
    def called_tool(self) -> bool:
        return self.stop_token_id == self._call_token or bool(self.tool_calls)

    @property
    def reasoning_text(self) -> str:
        return ITEM_SEPARATOR.join(item.text for item in self.items if item.kind == REASONING)

    @property
    def content_text(self) -> str:
        return ITEM_SEPARATOR.join(item.text for item in self.items if item.kind == MESSAGE)

    @property
    def content_logprobs(self) -> list[TokenLogprobs]:
        return [lp for item in self.items if item.kind == MESSAGE for lp in item.logprobs]

    @property
    def tool_calls(self) -> list[OutputItem]:
        return [item for item in self.items if item.kind == FUNCTION_CALL]

    @property
    def anomalies(self) -> Mapping[str, int]:
        return self._parser.anomalies
