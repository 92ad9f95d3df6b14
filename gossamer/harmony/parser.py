"""Streaming Harmony parser: completion token ids, one at a time -> message events.

The parser starts inside an assistant header, because the prompt ended with
`<|start|>assistant` (see render.py); a completion then reads like
`<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...<|return|>`.

It never raises on what the model writes. Anything off-format is recovered from and counted in
`anomalies` (a Counter by kind), and text that ends up in no message is handed back in an
`Anomaly` event, so no text vanishes silently:

- text before any header (or after a message ended) becomes a `final` assistant message;
- a first header with no `<|channel|>` that ends, or grows past `max_header_tokens`, without
  `<|message|>` is taken as such text too (the model skipped the header);
- a header that cannot be parsed skips everything up to the next `<|start|>`;
- `<|start|>` inside a message closes it first (the `<|end|>` was missing);
- other special tokens where they make no sense are dropped and counted.

Header parsing follows openai-harmony's StreamableParser, and on well-formed streams the
messages and text deltas are the same as its (tests/harmony/test_parser.py).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from gossamer.harmony.format_tokens import CHANNEL, CONSTRAIN, FormatTokenIds
from gossamer.harmony.prompt_text import FUNCTIONS_NAMESPACE
from gossamer.tokenizer import IncrementalDetokenizer, Tokenizer

ROLES = ("user", "assistant", "system", "developer", "tool")
FINAL_CHANNEL = "final"
ANALYSIS_CHANNEL = "analysis"
DEFAULT_MAX_HEADER_TOKENS = 64  # real headers are ~2-20 tokens
END_OF_STREAM = "eos"
# Rust's split_ascii_whitespace, which openai-harmony splits headers with.
_ASCII_WHITESPACE = re.compile(r"[ \t\n\x0c\r]+")


@dataclass(frozen=True)
class ParsedMessage:
    role: str
    channel: str | None
    recipient: str | None
    content_type: str | None  # e.g. "<|constrain|>json"
    text: str
    author_name: str | None = None  # tool messages: "functions.NAME"


@dataclass(frozen=True)
class MessageStart:
    role: str
    channel: str | None
    recipient: str | None
    content_type: str | None
    author_name: str | None = None
    header_text: str = ""  # the header's text tokens (special tokens left out)


@dataclass(frozen=True)
class TextDelta:
    text: str
    channel: str | None
    recipient: str | None


@dataclass(frozen=True)
class MessageEnd:
    message: ParsedMessage
    end: str  # "<|end|>", "<|call|>", "<|return|>", "<|start|>" (end was missing) or "eos"


@dataclass(frozen=True)
class Stop:
    """The model is done sampling (`<|return|>` or `<|call|>`). Tokens fed after it are
    parsed as further messages; a server simply stops feeding."""

    token_id: int


@dataclass(frozen=True)
class Anomaly:
    kind: str
    text: str = ""  # text that went into no message


Event = MessageStart | TextDelta | MessageEnd | Stop | Anomaly


@dataclass
class _Header:
    role: str
    channel: str | None = None
    recipient: str | None = None
    content_type: str | None = None
    author_name: str | None = None


@dataclass
class _OpenMessage:
    header: _Header
    text_parts: list[str] = field(default_factory=list)


class HarmonyStreamParser:
    """Feed completion token ids one at a time with `feed`; call `finish` at the end."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        role: str | None = "assistant",
        max_header_tokens: int = DEFAULT_MAX_HEADER_TOKENS,
    ):
        """`role`: the role the prompt already opened (None: expect `<|start|>` first)."""
        self._tokenizer = tokenizer
        self._ids = FormatTokenIds.from_tokenizer(tokenizer)
        self._header_specials = frozenset((self._ids.channel, self._ids.constrain))
        self._max_header_tokens = max_header_tokens
        self._detokenizer = IncrementalDetokenizer(tokenizer)
        self.anomalies: Counter[str] = Counter()
        self.messages: list[ParsedMessage] = []
        self.stopped = False
        self._header_role = role
        self._header_ids: list[int] = []
        self._message: _OpenMessage | None = None
        self._skipped_ids: list[int] | None = None  # set while skipping to the next <|start|>
        self._state = "header" if role else "expect_start"
        self._handlers = {
            "expect_start": self._feed_expect_start,
            "header": self._feed_header,
            "content": self._feed_content,
            "skip": self._feed_skip,
        }

    @property
    def num_anomalies(self) -> int:
        return sum(self.anomalies.values())

    @property
    def current_channel(self) -> str | None:
        return self._message.header.channel if self._message else None

    @property
    def current_recipient(self) -> str | None:
        return self._message.header.recipient if self._message else None

    def feed(self, token_id: int) -> list[Event]:
        """The events that `token_id` causes (often one TextDelta, often none)."""
        return self._handlers[self._state](token_id)

    def feed_many(self, token_ids: Iterable[int]) -> list[Event]:
        return [event for token_id in token_ids for event in self.feed(token_id)]

    def finish(self) -> list[Event]:
        """End of stream (e.g. max_tokens): close what is open."""
        if self._state == "content":
            return self._close_message(END_OF_STREAM)
        if self._state == "header":
            return self._abandon_header("header_cut_by_eos", END_OF_STREAM)
        if self._state == "skip":
            return self._end_skip()
        return []

    # -- states ---------------------------------------------------------------------------

    def _feed_expect_start(self, token_id: int) -> list[Event]:
        if token_id == self._ids.start:
            return self._begin_header(role=None)
        if token_id in self._ids.stop_ids:
            return [*self._count("stop_outside_message"), *self._stop(token_id)]
        if token_id == self._ids.channel:  # `<|start|>assistant` is missing: assume it
            events = self._count("missing_start")
            self._begin_header(role="assistant")
            return events + self._feed_header(token_id)
        if self._tokenizer.is_special(token_id):
            return self._count("stray_special_token")
        events = self._count("text_outside_message")
        events += self._open_message(_Header("assistant", FINAL_CHANNEL))
        return events + self._feed_content(token_id)

    def _feed_header(self, token_id: int) -> list[Event]:
        if token_id == self._ids.message:
            return self._end_header()
        if token_id == self._ids.start:
            events = self._abandon_header("header_cut_by_start", "<|start|>")
            return events + self._begin_header(role=None)
        if token_id in (self._ids.end, *self._ids.stop_ids):
            end = self._tokenizer.decode([token_id])
            events = self._abandon_header("header_without_message", end)
            return events + (self._stop(token_id) if token_id in self._ids.stop_ids else [])
        if self._tokenizer.is_special(token_id) and token_id not in self._header_specials:
            return self._count("special_token_in_header")
        self._header_ids.append(token_id)
        if len(self._header_ids) > self._max_header_tokens:
            return self._overlong_header()
        return []

    def _feed_content(self, token_id: int) -> list[Event]:
        if token_id == self._ids.end:
            return self._close_message("<|end|>")
        if token_id in self._ids.stop_ids:
            end = self._tokenizer.decode([token_id])
            return self._close_message(end) + self._stop(token_id)
        if token_id == self._ids.start:
            events = self._count("missing_end") + self._close_message("<|start|>")
            return events + self._begin_header(role=None)
        if self._tokenizer.is_special(token_id):
            return self._count("special_token_in_content")
        return self._text_delta(self._detokenizer.feed(token_id))

    def _feed_skip(self, token_id: int) -> list[Event]:
        assert self._skipped_ids is not None
        if token_id == self._ids.start:
            return self._end_skip() + self._begin_header(role=None)
        if token_id in self._ids.stop_ids:
            return self._end_skip() + self._stop(token_id)
        self._skipped_ids.append(token_id)
        return []

    # -- headers --------------------------------------------------------------------------

    def _begin_header(self, role: str | None) -> list[Event]:
        self._state, self._header_role, self._header_ids = "header", role, []
        return []

    def _end_header(self) -> list[Event]:
        header = parse_header(self._tokenizer.decode(self._header_ids), self._header_role)
        if header is None:
            events = self._count("malformed_header", self._header_text())
            self._state, self._skipped_ids = "skip", []
            return events
        return self._open_message(header, self._header_text())

    def _abandon_header(self, kind: str, end: str) -> list[Event]:
        """A header that ended (by `end`) without `<|message|>`: stray text if the model skipped
        the header of the first message, else an anomaly that keeps its text."""
        if self._looks_like_headerless_text():
            return self._headerless_text() + self._close_message(end)
        events = self._count(kind, self._header_text())
        self._state, self._header_ids = "expect_start", []
        return events

    def _overlong_header(self) -> list[Event]:
        if self._looks_like_headerless_text():
            return self._headerless_text()
        events = self._count("overlong_header", self._header_text())
        self._state, self._skipped_ids = "skip", []
        return events

    def _looks_like_headerless_text(self) -> bool:
        known_role = self._header_role is not None
        return known_role and self._ids.channel not in self._header_ids and bool(self._text_ids())

    def _headerless_text(self) -> list[Event]:
        """Re-read the header's text tokens as the content of a final message."""
        text_ids = self._text_ids()
        events = self._count("text_without_header")
        events += self._open_message(_Header(self._header_role or "assistant", FINAL_CHANNEL))
        for token_id in text_ids:
            events += self._text_delta(self._detokenizer.feed(token_id))
        return events

    def _text_ids(self) -> list[int]:
        return [token for token in self._header_ids if not self._tokenizer.is_special(token)]

    def _header_text(self) -> str:
        return _decode_bytes(self._tokenizer, self._text_ids())

    def _end_skip(self) -> list[Event]:
        assert self._skipped_ids is not None
        text = _decode_bytes(self._tokenizer, self._skipped_ids, skip_special=True)
        self._state, self._skipped_ids = "expect_start", None
        return self._count("skipped_message", text) if text else []

    # -- messages -------------------------------------------------------------------------

    def _open_message(self, header: _Header, header_text: str = "") -> list[Event]:
        self._message = _OpenMessage(header)
        self._state, self._header_ids = "content", []
        start = MessageStart(
            header.role,
            header.channel,
            header.recipient,
            header.content_type,
            header.author_name,
            header_text,
        )
        return [start]

    def _text_delta(self, text: str) -> list[Event]:
        if not text or self._message is None:
            return []
        self._message.text_parts.append(text)
        header = self._message.header
        return [TextDelta(text, header.channel, header.recipient)]

    def _close_message(self, end: str) -> list[Event]:
        events = self._text_delta(self._detokenizer.flush())
        assert self._message is not None
        header = self._message.header
        message = ParsedMessage(
            header.role,
            header.channel,
            header.recipient,
            header.content_type,
            "".join(self._message.text_parts),
            header.author_name,
        )
        self.messages.append(message)
        self._message, self._state = None, "expect_start"
        return [*events, MessageEnd(message, end)]

    def _stop(self, token_id: int) -> list[Event]:
        self.stopped = True
        return [Stop(token_id)]

    def _count(self, kind: str, text: str = "") -> list[Event]:
        self.anomalies[kind] += 1
        return [Anomaly(kind, text)]


def _decode_bytes(tokenizer: Tokenizer, ids: list[int], skip_special: bool = False) -> str:
    if skip_special:
        ids = [token for token in ids if not tokenizer.is_special(token)]
    return b"".join(tokenizer.token_bytes(token) for token in ids).decode("utf-8", "replace")


# ---------------------------------------------------------------------------------------------
# Header text -> role, channel, recipient, content type (openai-harmony's rules)
# ---------------------------------------------------------------------------------------------


def parse_header(text: str, role: str | None) -> _Header | None:
    """`role` is None when the header starts with it (after `<|start|>`). None: malformed.

    `<|channel|>NAME` may sit anywhere; the rest splits on whitespace into
    [role] [recipient | to=recipient] [content type], where `<|constrain|>` starts a type.
    """
    channel, text = _take_channel(text)
    if channel == "":
        return None
    parts = _ASCII_WHITESPACE.split(text.strip().replace(CONSTRAIN, f" {CONSTRAIN}").strip())
    parts = [part for part in parts if part]
    role_and_name = _take_role(parts, role)
    if role_and_name is None:
        return None
    header = _Header(role_and_name[0], channel, author_name=role_and_name[1])
    if parts and not _take_recipient_and_type(parts, header):
        return None
    return header


def _take_channel(text: str) -> tuple[str | None, str]:
    """The channel name after `<|channel|>` (up to whitespace or `<`), and the text without it."""
    index = text.find(CHANNEL)
    if index < 0:
        return None, text
    after = text[index + len(CHANNEL) :]
    length = next((i for i, char in enumerate(after) if char.isspace() or char == "<"), len(after))
    return after[:length], text[:index] + after[length:]


def _take_role(parts: list[str], role: str | None) -> tuple[str, str | None] | None:
    """Pops the role word off `parts`. An unknown first word followed by more header (or
    written `to=...`) names a tool, e.g. `functions.get_weather to=assistant`."""
    name = None
    if role is None:
        if not parts:
            return None
        if parts[0] in ROLES:
            role = parts[0]
        elif len(parts) > 1 or parts[0].startswith("to="):
            role, name = "tool", parts.pop(0)
        else:
            return None
    if parts and parts[0] == role:
        parts.pop(0)
    return role, name


def _take_recipient_and_type(parts: list[str], header: _Header) -> bool:
    """Fill recipient / content type from what is left; False if words remain unexplained."""
    last = parts.pop()
    if last.startswith("to="):
        header.recipient = last.removeprefix("to=")
    elif not parts and not last.startswith(CONSTRAIN):
        header.recipient = last
    else:
        header.content_type = last
        if parts:
            header.recipient = parts.pop().removeprefix("to=")
    return not parts


# ---------------------------------------------------------------------------------------------
# Whole completions, for a non-streaming server response
# ---------------------------------------------------------------------------------------------

MESSAGE_SEPARATOR = "\n"  # between two messages of the same kind (e.g. two analysis messages)


@dataclass(frozen=True)
class ToolCall:
    name: str  # without the "functions." namespace
    arguments: str  # the raw text the model wrote (JSON when it followed its tool schema)


@dataclass(frozen=True)
class ParsedCompletion:
    reasoning_text: str  # analysis-channel messages
    content_text: str  # final-channel messages and commentary preambles
    tool_calls: list[ToolCall]
    stop_token_id: int | None  # <|return|> / <|call|>; None when the stream just ended
    num_anomalies: int


def parse_completion(tokenizer: Tokenizer, token_ids: Iterable[int]) -> ParsedCompletion:
    """Split a finished completion (the ids after `<|start|>assistant`) for the API."""
    parser = HarmonyStreamParser(tokenizer)
    events = parser.feed_many(token_ids) + parser.finish()
    stops = [event.token_id for event in events if isinstance(event, Stop)]
    reasoning, content, calls = [], [], []
    for message in parser.messages:
        if message.recipient is not None:
            calls.append(ToolCall(tool_name(message.recipient), message.text))
        elif message.channel == ANALYSIS_CHANNEL:
            reasoning.append(message.text)
        else:
            content.append(message.text)
    return ParsedCompletion(
        reasoning_text=MESSAGE_SEPARATOR.join(reasoning),
        content_text=MESSAGE_SEPARATOR.join(content),
        tool_calls=calls,
        stop_token_id=stops[0] if stops else None,
        num_anomalies=parser.num_anomalies,
    )


def tool_name(recipient: str) -> str:
    """`functions.get_weather` -> `get_weather`; built-in tools (`browser.search`) unchanged."""
    return recipient.removeprefix(f"{FUNCTIONS_NAMESPACE}.")
