"""/v1/completions through the real HTTP server and the official openai client."""

from __future__ import annotations

import openai
import pytest

from tests.server.conftest import MODEL
from tests.server.fake_engine import FakeEngine

CONTINUATION = " jumps over the lazy dog.<|endoftext|> never sent"


@pytest.fixture
def plain_engine(engine: FakeEngine) -> FakeEngine:
    engine.script = lambda prompt, index: (
        CONTINUATION if index == 0 else f" choice {index}<|endoftext|>"
    )
    return engine


def test_string_prompt(client: openai.OpenAI, plain_engine: FakeEngine) -> None:
    completion = client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=50)
    (choice,) = completion.choices
    assert choice.text == " jumps over the lazy dog."
    assert choice.finish_reason == "stop"
    seen = plain_engine.seen[0]
    tokenizer = plain_engine.tokenizer
    assert seen.prompt_ids == tokenizer.encode("The quick brown fox")
    assert set(seen.params.stop_token_ids) == set(tokenizer.eos_token_ids)
    assert completion.usage.prompt_tokens == len(seen.prompt_ids)
    assert (
        completion.usage.completion_tokens == len(tokenizer.encode(" jumps over the lazy dog.")) + 1
    )
    assert completion.object == "text_completion"


def test_special_tokens_in_a_string_prompt_are_special(
    client: openai.OpenAI, plain_engine: FakeEngine
) -> None:
    client.completions.create(model=MODEL, prompt="<|start|>user<|message|>hi<|end|>", max_tokens=5)
    ids = plain_engine.seen[0].prompt_ids
    assert ids[0] == plain_engine.tokenizer.special_id("<|start|>")


def test_prompt_forms_and_choice_numbering(client: openai.OpenAI, plain_engine: FakeEngine) -> None:
    tokenizer = plain_engine.tokenizer
    ids = tokenizer.encode("Hello")
    for prompt, count in [(["a", "b"], 2), (ids, 1), ([ids, ids, ids], 3)]:
        plain_engine.seen.clear()
        completion = client.completions.create(model=MODEL, prompt=prompt, n=2, max_tokens=20)
        assert len(plain_engine.seen) == count
        assert [c.index for c in completion.choices] == list(range(2 * count))
        assert [c.text for c in completion.choices] == [
            " jumps over the lazy dog.",
            " choice 1",
        ] * count
        assert completion.usage.prompt_tokens == sum(len(s.prompt_ids) for s in plain_engine.seen)


def test_streaming(client: openai.OpenAI, plain_engine: FakeEngine) -> None:
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=["x", "y"],
            max_tokens=50,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts: dict[int, str] = {}
    finishes = {}
    for chunk in chunks[:-1]:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert texts == {0: " jumps over the lazy dog.", 1: " jumps over the lazy dog."}
    assert finishes == {0: "stop", 1: "stop"}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_echo_and_logprobs(client: openai.OpenAI, plain_engine: FakeEngine) -> None:
    completion = client.completions.create(
        model=MODEL, prompt="Once upon", max_tokens=4, echo=True, logprobs=2
    )
    (choice,) = completion.choices
    assert choice.text.startswith("Once upon jumps")
    assert choice.finish_reason == "length"
    logprobs = choice.logprobs
    assert "".join(logprobs.tokens) == choice.text
    prompt_len = len(plain_engine.tokenizer.encode("Once upon"))
    assert logprobs.token_logprobs[:prompt_len] == [None] * prompt_len
    assert logprobs.token_logprobs[prompt_len:] == [-0.25] * 4
    assert all(len(top) == 2 for top in logprobs.top_logprobs[prompt_len:])
    offsets = [0]
    for token in logprobs.tokens[:-1]:
        offsets.append(offsets[-1] + len(token))
    assert logprobs.text_offset == offsets


def test_stop_string(client: openai.OpenAI, plain_engine: FakeEngine) -> None:
    completion = client.completions.create(model=MODEL, prompt="x", stop=["lazy"], max_tokens=50)
    assert completion.choices[0].text == " jumps over the "
    assert completion.choices[0].finish_reason == "stop"


def test_suffix_is_rejected(client: openai.OpenAI, plain_engine: FakeEngine) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="x", suffix="y")
    assert caught.value.body["param"] == "suffix"
    assert plain_engine.seen == []
