"""Chat completions through the real HTTP server and the official openai client."""

from __future__ import annotations

import json

import openai
import pytest

from tests.server.conftest import MODEL
from tests.server.fake_engine import FakeEngine

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
WEATHER_CALL = (
    "<|channel|>analysis<|message|>Need weather.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    '{"city": "Paris, France"}<|call|>'
)
USER = [{"role": "user", "content": "Say hi"}]


def test_chat_non_streaming(client: openai.OpenAI, engine: FakeEngine) -> None:
    engine.cached_tokens = 7
    completion = client.chat.completions.create(model=MODEL, messages=USER, reasoning_effort="high")
    choice = completion.choices[0]
    assert choice.message.content == "Hi"
    assert choice.message.model_extra["reasoning_content"] == "thinking"
    assert choice.message.model_extra["reasoning"] == "thinking"
    assert choice.finish_reason == "stop"
    assert completion.model == MODEL and completion.id.startswith("chatcmpl-")
    seen = engine.seen[0]
    assert "Reasoning: high" in seen.prompt_text and "Say hi" in seen.prompt_text
    assert seen.prompt_text.endswith("<|start|>assistant")
    tokenizer = engine.tokenizer
    harmony_stops = {tokenizer.special_id("<|return|>"), tokenizer.special_id("<|call|>")}
    assert set(seen.params.stop_token_ids) == harmony_stops
    usage = completion.usage
    assert usage.prompt_tokens == len(seen.prompt_ids)
    script_tokens = tokenizer.encode(engine.script("", 0), allow_special=True)
    assert usage.completion_tokens == len(script_tokens)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens == 7
    # "thinking" and the analysis message's end are reasoning; the final message is not
    assert 1 <= usage.completion_tokens_details.reasoning_tokens < usage.completion_tokens


def _stream(client: openai.OpenAI, **kwargs) -> list:  # type: ignore[no-untyped-def]
    return list(client.chat.completions.create(model=MODEL, stream=True, **kwargs))


def _field(delta, name: str) -> str:  # type: ignore[no-untyped-def]
    return (delta.model_extra or {}).get(name) or ""


@pytest.mark.parametrize("tokens_per_update", [1, 3])
def test_chat_streaming(client: openai.OpenAI, engine: FakeEngine, tokens_per_update: int) -> None:
    engine.tokens_per_update = tokens_per_update
    engine.script = lambda prompt, index: (
        "<|channel|>analysis<|message|>Let me think about this.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Hello there, friend!<|return|>"
    )
    chunks = _stream(client, messages=USER, stream_options={"include_usage": True})
    first, *middle, last_choice_chunk, usage_chunk = chunks
    assert first.choices[0].delta.role == "assistant"
    deltas = [chunk.choices[0].delta for chunk in middle]
    reasoning = "".join(_field(delta, "reasoning_content") for delta in deltas)
    mirrored = "".join(_field(delta, "reasoning") for delta in deltas)
    content = "".join(delta.content or "" for delta in deltas)
    assert reasoning == mirrored == "Let me think about this."
    assert content == "Hello there, friend!"
    # reasoning arrives before content, token by token (several chunks each)
    kinds = [
        "r" if _field(d, "reasoning_content") else "c"
        for d in deltas
        if d.content or _field(d, "reasoning_content")
    ]
    assert kinds == sorted(kinds, reverse=True) and kinds.count("c") > 1 and kinds.count("r") > 1
    assert last_choice_chunk.choices[0].finish_reason == "stop"
    assert all(chunk.usage is None for chunk in chunks[:-1])
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens > 0
    assert usage_chunk.usage.completion_tokens_details.reasoning_tokens > 0


def test_chat_stream_without_usage_has_no_usage_chunk(
    client: openai.OpenAI, engine: FakeEngine
) -> None:
    chunks = _stream(client, messages=USER)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(chunk.usage is None for chunk in chunks)


def test_tool_call_non_streaming(client: openai.OpenAI, engine: FakeEngine) -> None:
    engine.script = lambda prompt, index: WEATHER_CALL
    completion = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL],
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.model_extra["reasoning_content"] == "Need weather."
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and len(call.id) > 10
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris, France"}
    prompt = engine.seen[0].prompt_text
    assert "namespace functions" in prompt and "type get_weather" in prompt


def test_tool_call_streaming(client: openai.OpenAI, engine: FakeEngine) -> None:
    engine.script = lambda prompt, index: WEATHER_CALL
    chunks = _stream(client, messages=USER, tools=[WEATHER_TOOL])
    tool_deltas = [call for chunk in chunks for call in (chunk.choices[0].delta.tool_calls or [])]
    head, *argument_chunks = tool_deltas
    assert head.index == 0 and head.id.startswith("call_") and head.type == "function"
    assert head.function.name == "get_weather" and head.function.arguments == ""
    assert len(argument_chunks) > 1  # the arguments stream token by token
    assert all(d.id is None and d.function.name is None for d in argument_chunks)
    arguments = "".join(d.function.arguments for d in argument_chunks)
    assert json.loads(arguments) == {"city": "Paris, France"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_round_trip(client: openai.OpenAI, engine: FakeEngine) -> None:
    """call -> tool result -> answer; the fake engine answers only when the rendered prompt
    carries the tool result as a Harmony tool message."""
    tool_result = '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{"temp_c": 21}<|end|>'

    def script(prompt: str, index: int) -> str:
        if tool_result in prompt:
            return "<|channel|>final<|message|>It is 21 degrees in Paris.<|return|>"
        return WEATHER_CALL

    engine.script = script
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL])
    call = first.choices[0].message.tool_calls[0]
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21}'},
    ]
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL])
    assert second.choices[0].message.content == "It is 21 degrees in Paris."
    assert second.choices[0].finish_reason == "stop"
    # the earlier call is rendered back as the assistant's commentary message to the tool
    assert "to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>" in (
        engine.seen[1].prompt_text
    )


def test_tool_choice_none_renders_no_tools(client: openai.OpenAI, engine: FakeEngine) -> None:
    client.chat.completions.create(
        model=MODEL, messages=USER, tools=[WEATHER_TOOL], tool_choice="none"
    )
    assert "namespace functions" not in engine.seen[0].prompt_text


def test_tool_choice_named_prefills_the_call(client: openai.OpenAI, engine: FakeEngine) -> None:
    # the model continues right after the forced header
    engine.script = lambda prompt, index: ' <|constrain|>json<|message|>{"city": "Oslo"}<|call|>'
    choice = {"type": "function", "function": {"name": "get_weather"}}
    completion = client.chat.completions.create(
        model=MODEL, messages=USER, tools=[WEATHER_TOOL], tool_choice=choice
    )
    assert engine.seen[0].prompt_text.endswith(
        "<|start|>assistant<|channel|>commentary to=functions.get_weather"
    )
    (call,) = completion.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    assert completion.choices[0].finish_reason == "tool_calls"


def test_tool_choice_required_prefills_the_namespace(
    client: openai.OpenAI, engine: FakeEngine
) -> None:
    engine.script = lambda prompt, index: (
        '.get_weather <|constrain|>json<|message|>{"city": "Rome"}<|call|>'
    )
    completion = client.chat.completions.create(
        model=MODEL, messages=USER, tools=[WEATHER_TOOL], tool_choice="required"
    )
    assert engine.seen[0].prompt_text.endswith("<|channel|>commentary to=functions")
    (call,) = completion.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Rome"}


def test_sampling_params_reach_the_engine(client: openai.OpenAI, engine: FakeEngine) -> None:
    client.chat.completions.create(
        model=MODEL,
        messages=USER,
        temperature=0.7,
        top_p=0.9,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        seed=1234,
        stop=["END", "STOP"],
        n=2,
        max_completion_tokens=77,
        max_tokens=5,  # max_completion_tokens wins
        logprobs=True,
        top_logprobs=3,
        extra_body={
            "top_k": 40,
            "min_p": 0.05,
            "repetition_penalty": 1.1,
            "ignore_eos": False,
            "min_tokens": 2,
            "cache_salt": "tenant-a",
        },
    )
    seen = engine.seen[0]
    params = seen.params
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.7, 0.9, 40, 0.05)
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (
        0.5,
        -0.5,
        1.1,
    )
    assert (params.seed, params.n, params.max_tokens, params.min_tokens) == (1234, 2, 77, 2)
    assert params.stop == ("END", "STOP") and params.logprobs == 3
    assert seen.cache_salt == "tenant-a"


def test_default_max_tokens_fills_the_context(client: openai.OpenAI, engine: FakeEngine) -> None:
    client.chat.completions.create(model=MODEL, messages=USER)
    seen = engine.seen[0]
    assert seen.params.max_tokens == engine.max_model_len - len(seen.prompt_ids)


def test_ignore_eos_drops_the_harmony_stop_tokens(
    client: openai.OpenAI, engine: FakeEngine
) -> None:
    completion = client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=40, extra_body={"ignore_eos": True}
    )
    assert engine.seen[0].params.stop_token_ids == ()
    assert engine.seen[0].params.ignore_eos
    assert completion.choices[0].message.content == "Hi"


def test_n_choices(client: openai.OpenAI, engine: FakeEngine) -> None:
    engine.script = lambda prompt, index: f"<|channel|>final<|message|>answer {index}<|return|>"
    completion = client.chat.completions.create(model=MODEL, messages=USER, n=3)
    assert [c.message.content for c in completion.choices] == ["answer 0", "answer 1", "answer 2"]
    assert [c.index for c in completion.choices] == [0, 1, 2]
    chunks = _stream(client, messages=USER, n=2)
    texts = {0: "", 1: ""}
    finishes = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert texts == {0: "answer 0", 1: "answer 1"} and finishes == {0: "stop", 1: "stop"}


def test_logprobs_cover_the_content_tokens(client: openai.OpenAI, engine: FakeEngine) -> None:
    engine.script = lambda prompt, index: (
        "<|channel|>analysis<|message|>hmm<|end|><|start|>assistant<|channel|>final<|message|>"
        "Bonjour le monde<|return|>"
    )
    completion = client.chat.completions.create(
        model=MODEL, messages=USER, logprobs=True, top_logprobs=2
    )
    entries = completion.choices[0].logprobs.content
    assert "".join(entry.token for entry in entries) == "Bonjour le monde"
    assert all(entry.logprob == -0.25 and len(entry.top_logprobs) == 2 for entry in entries)
    assert all(bytes(entry.bytes).decode() == entry.token for entry in entries)
    streamed = [
        entry
        for chunk in _stream(client, messages=USER, logprobs=True, top_logprobs=1)
        if chunk.choices and chunk.choices[0].logprobs
        for entry in chunk.choices[0].logprobs.content
    ]
    assert "".join(entry.token for entry in streamed) == "Bonjour le monde"


def test_stop_string_cuts_the_content(client: openai.OpenAI, engine: FakeEngine) -> None:
    engine.script = lambda prompt, index: (
        "<|channel|>final<|message|>one two STOP three four<|return|>"
    )
    completion = client.chat.completions.create(model=MODEL, messages=USER, stop=["STOP"])
    assert completion.choices[0].message.content == "one two "
    assert completion.choices[0].finish_reason == "stop"
    assert completion.choices[0].model_extra["stop_reason"] == "STOP"
    chunks = _stream(client, messages=USER, stop="STOP")
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "one two "


def test_max_tokens_gives_length(client: openai.OpenAI, engine: FakeEngine) -> None:
    completion = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=3)
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.completion_tokens == 3
    chunks = _stream(client, messages=USER, max_tokens=3)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_served_model_alias_and_default(client: openai.OpenAI, engine: FakeEngine) -> None:
    completion = client.chat.completions.create(model="gpt-oss-alias", messages=USER)
    assert completion.model == "gpt-oss-alias"


def test_preamble_and_call_stream_like_the_full_answer(
    client: openai.OpenAI, engine: FakeEngine
) -> None:
    engine.script = lambda prompt, index: (
        "<|channel|>commentary<|message|>Checking the weather.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Done.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city": "Lima"}<|call|>'
    )
    full = client.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER_TOOL])
    message = full.choices[0].message
    assert message.content == "Checking the weather.\nDone."
    assert message.tool_calls[0].function.name == "get_weather"
    chunks = _stream(client, messages=USER, tools=[WEATHER_TOOL])
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == message.content
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason == "tool_calls"


def test_text_without_a_header_is_content(client: openai.OpenAI, engine: FakeEngine) -> None:
    engine.script = lambda prompt, index: "Just plain words.<|return|>"
    completion = client.chat.completions.create(model=MODEL, messages=USER)
    assert completion.choices[0].message.content == "Just plain words."
    assert completion.choices[0].finish_reason == "stop"
