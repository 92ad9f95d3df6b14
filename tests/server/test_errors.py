"""Every bad request gets an OpenAI-style error with the right status, and none of them
disturbs requests in flight."""

from __future__ import annotations

import concurrent.futures

import httpx
import openai
import pytest

from tests.server.conftest import API_KEY, MODEL, ServerThread
from tests.server.fake_engine import FakeEngine

USER = [{"role": "user", "content": "hi"}]
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def _post(
    server: ServerThread,
    path: str,
    body: object = None,
    content: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}{path}", json=body, content=content,
        headers={**AUTH, **(headers or {})} if headers is None or "Authorization" not in headers else headers,
        timeout=10,
    )  # fmt: skip


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def chat(**fields: object) -> dict:
    return {"model": MODEL, "messages": USER, **fields}


BAD_REQUESTS = [
    # (path, body, status, param, code)
    ("/v1/chat/completions", chat(temperature="hot"), 400, "temperature", None),
    ("/v1/chat/completions", chat(messages="hi"), 400, "messages", None),
    ("/v1/chat/completions", {"model": MODEL}, 400, "messages", None),
    ("/v1/chat/completions", chat(messages=[]), 400, "messages", None),
    ("/v1/chat/completions", chat(model="no-such-model"), 404, "model", "model_not_found"),
    ("/v1/chat/completions", chat(max_tokens=0), 400, "max_tokens", None),
    ("/v1/chat/completions", chat(max_tokens=10**6), 400, "max_tokens", None),
    ("/v1/chat/completions", chat(temperature=-1), 400, "temperature", None),
    ("/v1/chat/completions", chat(top_p=0), 400, "top_p", None),
    ("/v1/chat/completions", chat(n=0), 400, "n", None),
    ("/v1/chat/completions", chat(logprobs=True, top_logprobs=50), 400, "top_logprobs", None),
    ("/v1/chat/completions", chat(reasoning_effort="extreme"), 400, "reasoning_effort", None),
    ("/v1/chat/completions", chat(messages=[{"role": "wizard", "content": "x"}]), 400, "messages", None),
    ("/v1/chat/completions",
     chat(tools=[{"type": "function", "function": {"name": "bad name!", "parameters": {}}}]), 400, "tools[0]", None),
    ("/v1/chat/completions",
     chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]), 400, "tools[0]", None),
    ("/v1/chat/completions",
     chat(tools=[{"type": "function", "function": {"name": "f", "parameters": "not a schema"}}]), 400, "tools[0]", None),
    ("/v1/chat/completions", chat(tool_choice="required"), 400, "tool_choice", None),
    ("/v1/chat/completions",
     chat(tools=[{"type": "function", "function": {"name": "f"}}],
          tool_choice={"type": "function", "function": {"name": "g"}}), 400, "tool_choice", None),
    ("/v1/chat/completions", chat(response_format={"type": "json_schema"}), 400, "response_format", None),
    ("/v1/completions", {"model": MODEL, "prompt": []}, 400, "prompt", None),
    ("/v1/completions", {"model": MODEL, "prompt": [10**9]}, 400, "prompt", None),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": -3}, 400, "max_tokens", None),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "best_of": 3}, 400, "best_of", None),
    ("/v1/responses", {"model": MODEL, "input": "x", "tools": [{"type": "web_search"}]}, 400, "tools[0]", None),
    ("/v1/responses", {"model": MODEL, "input": [{"type": "item_reference", "id": "x"}]}, 400, "input[0]", None),
    ("/v1/responses", {"model": MODEL, "input": "x", "previous_response_id": "resp_nope"}, 404,
     "previous_response_id", "previous_response_not_found"),
]  # fmt: skip


@pytest.mark.parametrize("path, body, status, param, code", BAD_REQUESTS)
def test_bad_request(
    server: ServerThread, engine: FakeEngine, path, body, status, param, code
) -> None:  # type: ignore[no-untyped-def]
    error = _error(_post(server, path, body), status)
    assert error["param"] == param
    assert error["code"] == code
    assert error["type"] in ("invalid_request_error", "not_found_error")
    assert engine.seen == []  # rejected before the engine


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b"\xff\xfe"])
def test_malformed_json(server: ServerThread, engine: FakeEngine, content: bytes) -> None:
    response = _post(server, "/v1/chat/completions", content=content,
                     headers={**AUTH, "Content-Type": "application/json"})  # fmt: skip
    assert _error(response, 400)["type"] == "invalid_request_error"


def test_api_key(server: ServerThread, engine: FakeEngine) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        response = httpx.post(
            f"{server.base_url}/v1/chat/completions", json=chat(), headers=headers
        )
        assert _error(response, 401)["code"] == "invalid_api_key"
        assert _error(httpx.get(f"{server.base_url}/v1/models", headers=headers), 401)
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(model=MODEL, messages=USER)
    assert engine.seen == []
    assert httpx.get(f"{server.base_url}/health").status_code == 200  # open without a key


def test_prompt_too_long(client: openai.OpenAI, engine: FakeEngine) -> None:
    long_text = "word " * 300
    engine.max_model_len = 200  # the server's own check
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": long_text}]
        )
    assert caught.value.code == "context_length_exceeded"
    engine.max_model_len = 4096
    engine.engine_prompt_limit = 100  # the engine's PromptTooLongError
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": long_text}], stream=stream
            )
        assert caught.value.code == "context_length_exceeded"
        assert caught.value.body["param"] == "messages"


def test_unknown_route_is_a_json_404(server: ServerThread) -> None:
    assert _error(httpx.get(f"{server.base_url}/v1/nothing", headers=AUTH), 404)


def test_engine_failure_is_a_500(client: openai.OpenAI, engine: FakeEngine) -> None:
    engine.fail_after = 3
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model=MODEL, messages=USER)
    assert caught.value.body["type"] == "server_error"
    engine.fail_after, engine.error_after = None, 3
    with pytest.raises(openai.InternalServerError) as caught:
        client.completions.create(model=MODEL, prompt="x")
    assert "fake device failure" in caught.value.body["message"]


@pytest.mark.parametrize("failure", ["fail_after", "error_after"])
def test_engine_failure_mid_stream(client: openai.OpenAI, engine: FakeEngine, failure: str) -> None:
    setattr(engine, failure, 4)
    received = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in client.chat.completions.create(model=MODEL, messages=USER, stream=True):
            received.append(chunk)
    assert received  # the stream had started before the error event
    assert caught.value.body["type"] == "server_error"
    setattr(engine, failure, 2)
    events = list(client.responses.create(model=MODEL, input="x", stream=True))
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]


def test_bad_requests_do_not_disturb_requests_in_flight(
    client: openai.OpenAI, server: ServerThread, engine: FakeEngine
) -> None:
    text = " ".join(f"w{i}" for i in range(30))
    engine.script = lambda prompt, index: f"<|channel|>final<|message|>{text}<|return|>"
    engine.token_delay = 0.01

    def slow_stream() -> str:
        chunks = client.chat.completions.create(model=MODEL, messages=USER, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        streams = [pool.submit(slow_stream) for _ in range(3)]
        plain = pool.submit(
            lambda: client.completions.create(model=MODEL, prompt="x", max_tokens=20)
        )
        bad = [pool.submit(_post, server, path, body) for path, body, *_ in BAD_REQUESTS]
        statuses = [future.result().status_code for future in bad]
        assert [s for s in statuses if s < 400] == []
        assert [future.result() for future in streams] == [text] * 3
        assert plain.result().choices[0].finish_reason == "length"
    assert engine.aborted == []
