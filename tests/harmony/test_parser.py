"""The streaming Harmony parser: equal to openai-harmony's StreamableParser on well-formed
completions, and never raising (nor silently dropping text) on anything else."""

from __future__ import annotations

import openai_harmony as oh
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gossamer.harmony.parser import (
    Anomaly,
    HarmonyStreamParser,
    MessageEnd,
    MessageStart,
    ParsedMessage,
    Stop,
    TextDelta,
    ToolCall,
    parse_completion,
)
from gossamer.tokenizer import Tokenizer

# Completions as the model writes them after the prompt's `<|start|>assistant`.
COMPLETIONS = {
    "analysis_then_final": "<|channel|>analysis<|message|>User asks 2+2. Simple.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>",
    "tool_call_channel_first": "<|channel|>analysis<|message|>Need get_weather.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"location":"San Francisco"}<|call|>',
    "tool_call_recipient_first": "<|channel|>analysis<|message|>Call it.<|end|>"
    "<|start|>assistant to=functions.lookup<|channel|>commentary <|constrain|>json"
    '<|message|>{"q": "日本"}<|call|>',
    "tool_call_constrain_glued": "<|channel|>commentary to=functions.f<|constrain|>json"
    "<|message|>{}<|call|>",
    "tool_call_plain_json_type": "<|channel|>commentary to=functions.f json<|message|>{}<|call|>",
    "preamble_then_call": "<|channel|>analysis<|message|>{long chain of thought}<|end|>"
    "<|start|>assistant<|channel|>commentary<|message|>**Action plan**:\n1. Generate a file\n"
    "2. Start the server<|end|><|start|>assistant<|channel|>commentary "
    'to=functions.generate_file<|constrain|>json<|message|>{"path": "index.html"}<|call|>',
    "several_analysis_messages": "<|channel|>analysis<|message|>First thought.<|end|>"
    "<|start|>assistant<|channel|>analysis<|message|>Second thought 🤔.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Done ✨ 👩‍👩‍👧‍👦<|return|>",
    "built_in_browser_call": "<|channel|>analysis to=browser.search<|message|>"
    '{"query": "gpt-oss"}<|call|>',
    "final_only_unicode": "<|channel|>final<|message|>Ünïcödé, 中文, emoji 🇫🇷\n\n  code:"
    "\n    x = 1\n<|return|>",
    "empty_final": "<|channel|>final<|message|><|return|>",
    "truncated_mid_content": "<|channel|>analysis<|message|>This is cut off mid sen",
}


def _openai_parse(encoding, ids: list[int]):
    """Per-token (delta, channel, recipient) and final messages from openai-harmony."""
    parser = oh.StreamableParser(encoding, oh.Role.ASSISTANT)
    steps = []
    for token_id in ids:
        parser.process(token_id)
        steps.append(
            (parser.last_content_delta or "", parser.current_channel, parser.current_recipient)
        )
    parser.process_eos()
    messages = [
        ParsedMessage(
            m.author.role.value,
            m.channel,
            m.recipient,
            m.content_type,
            m.content[0].text,
            m.author.name,
        )
        for m in parser.messages
    ]
    return steps, messages


def _our_parse(tokenizer: Tokenizer, ids: list[int]):
    parser = HarmonyStreamParser(tokenizer)
    steps = []
    for token_id in ids:
        deltas = [event.text for event in parser.feed(token_id) if isinstance(event, TextDelta)]
        steps.append(("".join(deltas), parser.current_channel, parser.current_recipient))
    parser.finish()
    return steps, parser.messages, parser


@pytest.mark.parametrize("text", COMPLETIONS.values(), ids=COMPLETIONS.keys())
def test_equals_openai_harmony_streamable_parser(
    harmony_tokenizer: Tokenizer, openai_harmony_encoding, text: str
):
    ids = harmony_tokenizer.encode(text, allow_special=True)
    expected_steps, expected_messages = _openai_parse(openai_harmony_encoding, ids)
    steps, messages, parser = _our_parse(harmony_tokenizer, ids)
    assert messages == expected_messages
    assert steps == expected_steps
    assert parser.num_anomalies == 0


def test_equals_openai_harmony_on_its_own_rendering(
    harmony_tokenizer: Tokenizer, openai_harmony_encoding
):
    """Completion tokens made by openai-harmony's renderer (header pieces tokenized apart)."""
    say = oh.Message.from_role_and_content
    messages = [
        say(oh.Role.ASSISTANT, "Think in 日本語 🤔").with_channel("analysis"),
        say(oh.Role.ASSISTANT, "Let me check.").with_channel("commentary"),
        say(oh.Role.ASSISTANT, '{"a": 1}')
        .with_channel("commentary")
        .with_recipient("functions.tool_a")
        .with_content_type("<|constrain|>json"),
    ]
    ids = [t for m in messages for t in openai_harmony_encoding.render(m)]
    ids = ids[2:]  # the prompt already holds `<|start|>assistant`
    assert harmony_tokenizer.decode(ids[:1]) == "<|channel|>"
    expected_steps, expected_messages = _openai_parse(openai_harmony_encoding, ids)
    steps, parsed, _ = _our_parse(harmony_tokenizer, ids)
    assert parsed == expected_messages
    assert steps == expected_steps


def test_lone_constrain_is_a_content_type(harmony_tokenizer: Tokenizer, openai_harmony_encoding):
    """openai-harmony 0.0.8 reads `<|channel|>final <|constrain|>json` as a message TO
    "<|constrain|>json"; later openai-harmony (and we) read it as the content type."""
    text = "<|channel|>final <|constrain|>json<|message|>{}<|return|>"
    ids = harmony_tokenizer.encode(text, allow_special=True)
    _, (theirs,) = _openai_parse(openai_harmony_encoding, ids)
    _, (ours,), _ = _our_parse(harmony_tokenizer, ids)
    assert (theirs.recipient, theirs.content_type) == ("<|constrain|>json", None)
    assert (ours.recipient, ours.content_type) == (None, "<|constrain|>json")
    assert parse_completion(harmony_tokenizer, ids).content_text == "{}"


def test_events_of_a_tool_call_stream(harmony_tokenizer: Tokenizer):
    ids = harmony_tokenizer.encode(COMPLETIONS["tool_call_channel_first"], allow_special=True)
    parser = HarmonyStreamParser(harmony_tokenizer)
    events = parser.feed_many(ids)
    starts = [e for e in events if isinstance(e, MessageStart)]
    assert [(s.role, s.channel, s.recipient, s.content_type) for s in starts] == [
        ("assistant", "analysis", None, None),
        ("assistant", "commentary", "functions.get_weather", "<|constrain|>json"),
    ]
    ends = [e for e in events if isinstance(e, MessageEnd)]
    assert [e.end for e in ends] == ["<|end|>", "<|call|>"]
    assert events[-1] == Stop(harmony_tokenizer.special_id("<|call|>")) and parser.stopped
    call_deltas = [e for e in events if isinstance(e, TextDelta) and e.recipient]
    assert "".join(d.text for d in call_deltas) == '{"location":"San Francisco"}'
    assert all(d.channel == "commentary" for d in call_deltas)


def test_parse_completion_for_the_server(harmony_tokenizer: Tokenizer):
    def parse(name: str):
        ids = harmony_tokenizer.encode(COMPLETIONS[name], allow_special=True)
        return parse_completion(harmony_tokenizer, ids)

    answer = parse("several_analysis_messages")
    assert answer.reasoning_text == "First thought.\nSecond thought 🤔."
    assert answer.content_text == "Done ✨ 👩‍👩‍👧‍👦" and answer.tool_calls == []
    assert answer.stop_token_id == harmony_tokenizer.special_id("<|return|>")
    call = parse("preamble_then_call")
    assert call.reasoning_text == "{long chain of thought}"
    assert call.content_text.startswith("**Action plan**")
    assert call.tool_calls == [ToolCall("generate_file", '{"path": "index.html"}')]
    assert parse("built_in_browser_call").tool_calls == [
        ToolCall("browser.search", '{"query": "gpt-oss"}')
    ]
    cut = parse("truncated_mid_content")
    assert cut.reasoning_text == "This is cut off mid sen" and cut.stop_token_id is None
    assert cut.num_anomalies == 0


# -- recovery from malformed streams ------------------------------------------------------


def _parse_text(tokenizer: Tokenizer, text: str, role: str | None = "assistant"):
    parser = HarmonyStreamParser(tokenizer, role=role)
    events = parser.feed_many(tokenizer.encode(text, allow_special=True)) + parser.finish()
    messages = [(m.channel, m.recipient, m.text) for m in parser.messages]
    return messages, parser.anomalies, events


@pytest.mark.parametrize(
    ("text", "messages", "anomaly"),
    [
        # the model skipped the header: its text is the answer
        ("Just an answer.<|return|>", [("final", None, "Just an answer.")], "text_without_header"),
        (
            "Just an answer, cut off",
            [("final", None, "Just an answer, cut off")],
            "text_without_header",
        ),
        # text after a message ended, with no <|start|>
        (
            "<|channel|>analysis<|message|>hm<|end|>stray words<|return|>",
            [("analysis", None, "hm"), ("final", None, "stray words")],
            "text_outside_message",
        ),
        # <|end|> missing before the next <|start|>
        (
            "<|channel|>analysis<|message|>a<|start|>assistant<|channel|>final<|message|>b<|return|>",
            [("analysis", None, "a"), ("final", None, "b")],
            "missing_end",
        ),
        # `<|start|>assistant` missing before the next header
        (
            "<|channel|>analysis<|message|>a<|end|><|channel|>final<|message|>b<|return|>",
            [("analysis", None, "a"), ("final", None, "b")],
            "missing_start",
        ),
        # a header that cannot be parsed: its message is skipped
        (
            "<|channel|>final junk words here<|message|>lost<|end|>"
            "<|start|>assistant<|channel|>final<|message|>kept<|return|>",
            [("final", None, "kept")],
            "malformed_header",
        ),
        (
            "<|channel|><|message|>x<|end|><|start|>assistant<|channel|>final<|message|>y<|return|>",
            [("final", None, "y")],
            "malformed_header",
        ),
        # special tokens inside content are dropped
        (
            "<|channel|>final<|message|>a<|constrain|>b<|reserved_200013|>c<|return|>",
            [("final", None, "abc")],
            "special_token_in_content",
        ),
        (
            "<|channel|>final<|endoftext|><|message|>ok<|return|>",
            [("final", None, "ok")],
            "special_token_in_header",
        ),
        ("<|channel|>final<|return|>", [], "header_without_message"),
        (
            "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>fin",
            [("analysis", None, "a")],
            "header_cut_by_eos",
        ),
        (
            "<|channel|>final<|message|>a<|end|><|end|><|start|>assistant<|channel|>final"
            "<|message|>b<|return|>",
            [("final", None, "a"), ("final", None, "b")],
            "stray_special_token",
        ),
    ],
)
def test_recovers_and_counts_anomalies(
    harmony_tokenizer: Tokenizer, text: str, messages: list, anomaly: str
):
    parsed, anomalies, _ = _parse_text(harmony_tokenizer, text)
    assert parsed == messages
    assert anomalies[anomaly] >= 1


def test_malformed_header_hands_back_the_skipped_text(harmony_tokenizer: Tokenizer):
    text = "<|channel|>final a b c<|message|>skipped text<|end|>"
    _, anomalies, events = _parse_text(harmony_tokenizer, text)
    anomaly_texts = [e.text for e in events if isinstance(e, Anomaly)]
    assert anomaly_texts == ["final a b c", "skipped text"]
    assert anomalies == {"malformed_header": 1, "skipped_message": 1}


def test_overlong_header_without_channel_streams_as_final_text(harmony_tokenizer: Tokenizer):
    text = "word " * 100
    parser = HarmonyStreamParser(harmony_tokenizer, max_header_tokens=8)
    ids = harmony_tokenizer.encode(text)
    first_events = parser.feed_many(ids[:9])
    assert any(isinstance(e, TextDelta) for e in first_events)  # streaming started early
    parser.feed_many(ids[9:])
    parser.finish()
    assert parser.messages == [ParsedMessage("assistant", "final", None, None, text)]


def test_unfinished_character_at_end_of_stream(harmony_tokenizer: Tokenizer):
    ids = harmony_tokenizer.encode("<|channel|>final<|message|>ok 🤔", allow_special=True)
    parser = HarmonyStreamParser(harmony_tokenizer)
    parser.feed_many(ids[:-1])
    parser.finish()
    assert parser.messages[0].text.startswith("ok ") and parser.messages[0].text[-1] == "\ufffd"


def test_parser_without_a_given_role_reads_full_messages(harmony_tokenizer: Tokenizer):
    text = (
        "<|start|>assistant<|channel|>final<|message|>hi<|end|>"
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>sun<|end|>"
    )
    parser = HarmonyStreamParser(harmony_tokenizer, role=None)
    parser.feed_many(harmony_tokenizer.encode(text, allow_special=True))
    assert parser.messages == [
        ParsedMessage("assistant", "final", None, None, "hi"),
        ParsedMessage("tool", "commentary", "assistant", None, "sun", "functions.get_weather"),
    ]


# -- fuzzing --------------------------------------------------------------------------------

FORMAT_TOKENS = [
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|return|>",
    "<|call|>",
    "<|endoftext|>",
    "<|reserved_200013|>",
]
TEXT_PIECES = [
    "assistant",
    "user",
    "tool",
    "analysis",
    "commentary",
    "final",
    " to=functions.f",
    "to=",
    " json",
    "json",
    " ",
    "\n",
    "Hello",
    " world",
    '{"a": 1}',
    "é",
    "日本",
    "functions.get_weather",
    " to=assistant",
    "<",
    "|>",
    "x",
]


def _text_token_ids(tokenizer: Tokenizer) -> list[int]:
    """Single tokens that decode to complete UTF-8 on their own, so the text they carry can
    be checked piece by piece."""
    ids = {token for piece in TEXT_PIECES for token in tokenizer.encode(piece)}
    return sorted(i for i in ids if "\ufffd" not in tokenizer.decode([i]))


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data(), start_with_role=st.booleans())
def test_fuzz_never_raises_and_never_loses_text(
    harmony_tokenizer: Tokenizer, data: st.DataObject, start_with_role: bool
):
    specials = [harmony_tokenizer.special_id(name) for name in FORMAT_TOKENS]
    text_ids = _text_token_ids(harmony_tokenizer)
    ids = data.draw(st.lists(st.sampled_from(specials + text_ids * 3), max_size=60))
    parser = HarmonyStreamParser(
        harmony_tokenizer, role="assistant" if start_with_role else None, max_header_tokens=12
    )
    events = parser.feed_many(ids) + parser.finish()

    # every text token shows up exactly once, in order: in a header, a delta or an anomaly
    accounted = "".join(
        e.header_text if isinstance(e, MessageStart) else e.text
        for e in events
        if isinstance(e, (MessageStart, TextDelta, Anomaly))
    )
    assert accounted == "".join(harmony_tokenizer.decode([i]) for i in ids if i in text_ids)
    # a message's text is exactly its deltas, and every anomaly is counted
    ends = [e for e in events if isinstance(e, MessageEnd)]
    assert [e.message for e in ends] == parser.messages
    assert parser.num_anomalies == sum(isinstance(e, Anomaly) for e in events)
    _assert_deltas_match_messages(events)


def _assert_deltas_match_messages(events: list) -> None:
    current: list[str] | None = None
    for event in events:
        if isinstance(event, MessageStart):
            assert current is None
            current = []
        elif isinstance(event, TextDelta):
            assert current is not None
            current.append(event.text)
        elif isinstance(event, MessageEnd):
            assert current is not None and "".join(current) == event.message.text
            current = None


_CONTENT = st.lists(
    st.sampled_from([*'ab xyz\n{}":,é日本<|>', "🤔", "👩‍👧", "<|end|>"]), max_size=20
).map("".join)
_MESSAGES = st.lists(
    st.tuples(
        st.sampled_from(["analysis", "commentary", "final"]),
        st.sampled_from([None, "functions.get_weather", "browser.search"]),
        st.booleans(),  # <|constrain|>json
        st.booleans(),  # recipient before the channel
        _CONTENT,
    ),
    min_size=1,
    max_size=4,
)


def _completion_ids(tokenizer: Tokenizer, messages: list, last: str | None) -> list[int]:
    special = tokenizer.special_id
    ids: list[int] = []
    for index, (channel, recipient, constrain, recipient_first, text) in enumerate(messages):
        if index:
            ids += [special("<|start|>"), *tokenizer.encode("assistant")]
        to = tokenizer.encode(f" to={recipient}") if recipient else []
        header = [special("<|channel|>"), *tokenizer.encode(channel)]
        header = to + header if recipient_first else header + to
        if constrain and recipient:  # without one, see test_lone_constrain_is_a_content_type
            header += [*tokenizer.encode(" "), special("<|constrain|>"), *tokenizer.encode("json")]
        end = last if index == len(messages) - 1 else "<|end|>"
        ids += [*header, special("<|message|>"), *tokenizer.encode(text)]
        ids += [special(end)] if end else []
    return ids


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(messages=_MESSAGES, last=st.sampled_from(["<|return|>", "<|call|>", "<|end|>", None]))
def test_random_well_formed_streams_equal_openai_harmony(
    harmony_tokenizer: Tokenizer, openai_harmony_encoding, messages: list, last: str | None
):
    ids = _completion_ids(harmony_tokenizer, messages, last)
    expected_steps, expected_messages = _openai_parse(openai_harmony_encoding, ids)
    steps, parsed, parser = _our_parse(harmony_tokenizer, ids)
    assert parsed == expected_messages
    assert steps == expected_steps
    assert parser.num_anomalies == 0
