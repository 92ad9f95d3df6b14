"""/v1/responses through the real HTTP server and the official openai client."""

from __future__ import annotations

import json

import openai
import pytest

from gossamer.server.responses import ResponseStore, StoredResponse
from tests.server.conftest import MODEL
from tests.server.fake_engine import FakeEngine

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
WEATHER_CALL = (
    "<|channel|>analysis<|message|>Need weather.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}<|call|>'
)
TOOL_RESULT = (
    "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>sunny, 25C<|end|>"
)


def test_non_streaming(client: openai.OpenAI, engine: FakeEngine) -> None:
    response = client.responses.create(
        model=MODEL, input="Say hi", instructions="Be brief.", reasoning={"effort": "low"}
    )
    assert response.status == "completed" and response.id.startswith("resp_")
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == "thinking"
    assert message.type == "message" and message.content[0].type == "output_text"
    assert response.output_text == "Hi"
    prompt = engine.seen[0].prompt_text
    assert "# Instructions\n\nBe brief." in prompt and "Reasoning: low" in prompt
    assert response.usage.input_tokens == len(engine.seen[0].prompt_ids)
    assert 0 < response.usage.output_tokens_details.reasoning_tokens < response.usage.output_tokens


def test_streaming_events(client: openai.OpenAI, engine: FakeEngine) -> None:
    engine.script = lambda prompt, index: (
        "<|channel|>analysis<|message|>Think a bit more.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Hello world again<|return|>"
    )
    events = list(client.responses.create(model=MODEL, input="hi", stream=True))
    types = [event.type for event in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    reasoning = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert reasoning == "Think a bit more." and text == "Hello world again"
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert added == ["reasoning", "message"] == [item.type for item in done]
    assert done[1].content[0].text == "Hello world again"
    assert types.count("response.content_part.added") == 2
    assert types.index("response.output_text.done") < types.index("response.completed")
    final = events[-1].response
    assert final.output_text == "Hello world again" and final.usage.output_tokens > 0


def test_function_call_round_trip_with_previous_response(
    client: openai.OpenAI, engine: FakeEngine
) -> None:
    def script(prompt: str, index: int) -> str:
        if TOOL_RESULT in prompt:
            return "<|channel|>final<|message|>Sunny and 25C.<|return|>"
        return WEATHER_CALL

    engine.script = script
    first = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER_TOOL])
    call = next(item for item in first.output if item.type == "function_call")
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    assert json.loads(call.arguments) == {"city": "Paris"}
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 25C"}],
        tools=[WEATHER_TOOL],
    )
    assert second.output_text == "Sunny and 25C."
    prompt = engine.seen[1].prompt_text
    assert "Weather in Paris?" in prompt  # the stored conversation came back
    assert (
        'to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city": "Paris"}<|call|>'
        in prompt
    )
    assert client.responses.retrieve(second.id).output_text == "Sunny and 25C."


def test_function_call_items_as_input(client: openai.OpenAI, engine: FakeEngine) -> None:
    engine.script = lambda prompt, index: (
        "<|channel|>final<|message|>ok<|return|>" if TOOL_RESULT in prompt else WEATHER_CALL
    )
    response = client.responses.create(
        model=MODEL,
        tools=[WEATHER_TOOL],
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "Need weather."}],
            },
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city": "Paris"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 25C"},
        ],
    )
    assert response.output_text == "ok"
    assert "<|channel|>analysis<|message|>Need weather.<|end|>" in engine.seen[0].prompt_text


def test_streamed_function_call(client: openai.OpenAI, engine: FakeEngine) -> None:
    engine.script = lambda prompt, index: WEATHER_CALL
    events = list(
        client.responses.create(model=MODEL, input="w?", tools=[WEATHER_TOOL], stream=True)
    )
    arguments = "".join(
        e.delta for e in events if e.type == "response.function_call_arguments.delta"
    )
    assert json.loads(arguments) == {"city": "Paris"}
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done.arguments == arguments
    call = events[-1].response.output[-1]
    assert call.type == "function_call" and call.name == "get_weather"


def test_store_false_is_not_stored(client: openai.OpenAI, engine: FakeEngine) -> None:
    response = client.responses.create(model=MODEL, input="hi", store=False)
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.create(model=MODEL, input="again", previous_response_id=response.id)
    assert caught.value.body["code"] == "previous_response_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_max_output_tokens_gives_incomplete(client: openai.OpenAI, engine: FakeEngine) -> None:
    response = client.responses.create(model=MODEL, input="hi", max_output_tokens=3)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    events = list(
        client.responses.create(model=MODEL, input="hi", max_output_tokens=3, stream=True)
    )
    assert events[-1].type == "response.incomplete"


def test_store_is_a_bounded_lru() -> None:
    store = ResponseStore(capacity=2)
    for name in ("a", "b"):
        store.put(name, StoredResponse({"id": name}, []))
    assert store.get("a") is not None  # "a" is now the most recent
    store.put("c", StoredResponse({"id": "c"}, []))
    assert store.get("b") is None and store.get("a") is not None and len(store) == 2
