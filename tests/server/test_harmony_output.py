"""The server's Harmony adapter agrees with the parser's own whole-completion split, whatever
the tokens per update, and stop strings are cut exactly even across deltas."""

from __future__ import annotations

import pytest

from gossamer.harmony import parse_completion
from gossamer.server.harmony_output import (
    FUNCTION_CALL,
    HarmonyOutput,
    ItemDelta,
    ItemDone,
    ItemStart,
    StopTrimmer,
)

COMPLETIONS = [
    "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>Hi there<|return|>",
    "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|>"
    "<|start|>assistant<|channel|>commentary<|message|>pre<|end|>"
    '<|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"x": 1}<|call|>',
    "<|channel|>final<|message|>cut short",  # max_tokens: no end token
    "no header at all, émoji 🙂<|return|>",
    "<|channel|>commentary to=functions.a <|constrain|>json<|message|>{}<|call|>",
]


@pytest.mark.parametrize("completion", COMPLETIONS)
@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_agrees_with_parse_completion(harmony_tokenizer, completion: str, chunk: int) -> None:  # type: ignore[no-untyped-def]
    ids = harmony_tokenizer.encode(completion, allow_special=True)
    reference = parse_completion(harmony_tokenizer, ids)
    output = HarmonyOutput(harmony_tokenizer)
    events = []
    for start in range(0, len(ids), chunk):
        events += output.add(ids[start : start + chunk])
    events += output.finish()
    assert output.reasoning_text == reference.reasoning_text
    assert output.content_text == reference.content_text
    assert [(c.name, c.text) for c in output.tool_calls] == [
        (c.name, c.arguments) for c in reference.tool_calls
    ]
    assert output.stop_token_id == reference.stop_token_id
    # the events tell the same story as the finished items
    for index, item in enumerate(output.items):
        deltas = [e.text for e in events if isinstance(e, ItemDelta) and e.item == index]
        assert "".join(deltas) == item.text
        (start_event,) = [e for e in events if isinstance(e, ItemStart) and e.item == index]
        (done,) = [e for e in events if isinstance(e, ItemDone) and e.item == index]
        assert start_event.kind == done.kind == item.kind and done.text == item.text
        if item.kind == FUNCTION_CALL:
            assert start_event.call_id == done.call_id and start_event.call_id.startswith("call_")


def test_prefill_is_parsed_but_not_shown(harmony_tokenizer) -> None:  # type: ignore[no-untyped-def]
    prefill = harmony_tokenizer.encode("<|channel|>commentary to=functions.get", allow_special=True)
    output = HarmonyOutput(harmony_tokenizer, prefill_ids=prefill)
    rest = harmony_tokenizer.encode(
        "_weather <|constrain|>json<|message|>{}<|call|>", allow_special=True
    )
    output.add(rest)
    (call,) = output.tool_calls
    assert call.name == "get_weather" and call.text == "{}"
    assert output.called_tool


@pytest.mark.parametrize("pieces", [["ab STOP cd"], ["ab ST", "OP cd"], ["ab S", "T", "O", "P"]])
def test_stop_trimmer(pieces: list[str]) -> None:
    trimmer = StopTrimmer(["STOP", "XY"])
    shown = "".join(trimmer.push(piece) for piece in pieces)
    assert shown == "ab " and trimmer.stopped
    assert trimmer.push("more") == "" and trimmer.flush() == ""


def test_stop_trimmer_releases_held_text_at_the_end() -> None:
    trimmer = StopTrimmer(["STOP"], include_stop=True)
    assert trimmer.push("abc ST") == "abc"  # " ST" could still grow into "STOP": held back
    assert trimmer.flush() == " ST"
    assert StopTrimmer(["STOP"], include_stop=True).push("x STOP y") == "x STOP"
