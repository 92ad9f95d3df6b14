"""One request against the live fake server: known delays give known TTFT/ITL/TPOT/E2EL, usage
is read for each endpoint, and every kind of failure is recorded instead of raised."""

from __future__ import annotations

import asyncio
import statistics
import time

import httpx
import pytest

from gossamer.bench.client import ClientConfig, RequestRecord, build_payload, send_request
from gossamer.bench.metrics import request_tpot
from tests.bench.fake_openai_server import MODEL, Behaviour, free_port

FIRST_DELAY, TOKEN_DELAY = 0.060, 0.020
# Sleeps never end early; a loaded 2-core machine can make them late.
EARLY_S, LATE_S = 0.002, 0.030


def send_all(config: ClientConfig, count: int, max_tokens: int = 6) -> list[RequestRecord]:
    """`count` sequential requests on one connection, after one unrecorded warm-up request."""

    async def go():
        records = []
        async with httpx.AsyncClient(timeout=config.timeout_s) as http:
            for index in range(-1, count):
                record = RequestRecord(index, index, 0, max_tokens, 3)
                await send_request(
                    http,
                    config,
                    [{"role": "user", "content": "one two three"}],
                    record,
                    time.perf_counter(),
                )
                if index >= 0:
                    records.append(record)
        return records

    return asyncio.run(go())


def near(measured: float, expected: float) -> bool:
    return expected - EARLY_S <= measured <= expected + LATE_S


@pytest.mark.parametrize("endpoint", ["chat", "completions", "responses"])
def test_known_delays_give_known_timings(fake_server, endpoint):
    reasoning = 0 if endpoint == "completions" else 2  # completions has no reasoning channel
    server = fake_server(
        Behaviour(
            first_token_delay=FIRST_DELAY, token_delay=TOKEN_DELAY, reasoning_tokens=reasoning
        )
    )
    records = send_all(ClientConfig(server.base_url, endpoint, MODEL), count=3, max_tokens=6)
    for record in records:
        assert record.success, record.error
        assert near(record.ttft, FIRST_DELAY)
        # the first content token comes after the reasoning tokens
        assert near(record.ttfct, FIRST_DELAY + reasoning * TOKEN_DELAY)
        assert len(record.itl) == 5  # 6 token events; role/finish/usage chunks are not tokens
        assert near(statistics.median(record.itl), TOKEN_DELAY)
        assert near(record.e2el, FIRST_DELAY + 5 * TOKEN_DELAY)
        assert near(request_tpot(record), TOKEN_DELAY)
        assert record.output_tokens == 6 and record.output_tokens_source == "usage"
        assert record.reasoning_tokens == reasoning
        assert record.input_tokens == 3  # the fake server counts words
        assert record.num_reasoning_events == reasoning
        assert record.num_content_events == 6 - reasoning


def test_finished_streams_give_their_connection_back(fake_server):
    server = fake_server(Behaviour(token_delay=0.001))
    send_all(ClientConfig(server.base_url, "chat", MODEL), count=4)
    assert len(server.posts) == 5 and server.connections == 1  # no reconnect per request


def test_reasoning_and_content_text_are_kept_apart(fake_server):
    server = fake_server(Behaviour(reasoning_tokens=2))
    (record,) = send_all(ClientConfig(server.base_url, "chat", MODEL), count=1, max_tokens=4)
    assert record.reasoning_text == "r0 r1 "
    assert record.content_text == "c2 c3 "
    assert record.finish_reason == "length"


def test_payload_asks_for_usage_and_fixed_output(fake_server):
    server = fake_server()
    config = ClientConfig(
        server.base_url,
        "chat",
        MODEL,
        headers={"X-Team": "bench"},
        ignore_eos=True,
        temperature=0.0,
        extra_body={"top_p": 0.5},
    )
    send_all(config, count=1, max_tokens=5)
    body = server.posts[-1].body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_completion_tokens"] == 5
    assert body["ignore_eos"] is True and body["min_tokens"] == 5
    assert body["temperature"] == 0.0 and body["top_p"] == 0.5
    assert server.posts[-1].headers["x-team"] == "bench"


def test_responses_payload_puts_system_into_instructions():
    config = ClientConfig("http://127.0.0.1:1", "responses", MODEL)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    body = build_payload(config, messages, max_tokens=7)
    assert body["instructions"] == "be brief"
    assert body["input"] == [{"role": "user", "content": "hi"}]
    assert body["max_output_tokens"] == 7 and "stream_options" not in body
    assert "ignore_eos" not in body


FAILURES = [
    (Behaviour(status=400), "HTTP 400"),
    (Behaviour(status=503), "HTTP 503"),
    (Behaviour(token_delay=0.005, cut_after=3), "RemoteProtocolError"),
    (Behaviour(send_done=False), "StreamIncomplete"),
    (Behaviour(error_event=True), "ServerError"),
    (Behaviour(content_tokens=0), "NoTokens"),
]


@pytest.mark.parametrize(("behaviour", "kind"), FAILURES, ids=[k for _, k in FAILURES])
@pytest.mark.parametrize("endpoint", ["chat", "responses"])
def test_failures_are_recorded_not_raised(fake_server, endpoint, behaviour, kind):
    server = fake_server(lambda index, _request: Behaviour() if index == 0 else behaviour)
    (record,) = send_all(ClientConfig(server.base_url, endpoint, MODEL), count=1)
    assert not record.success
    assert record.error_kind == kind, record.error
    assert record.error
    if kind.startswith("HTTP"):
        assert record.http_status == int(kind.split()[1])
        assert "injected status" in record.error  # the server's error body is kept


def test_cut_stream_keeps_partial_timings(fake_server):
    server = fake_server(lambda i, _r: Behaviour() if i == 0 else Behaviour(cut_after=3))
    (record,) = send_all(ClientConfig(server.base_url, "chat", MODEL), count=1)
    assert record.error_kind == "RemoteProtocolError"
    assert record.ttft is not None and len(record.itl) == 2  # three tokens arrived


def test_timeout_and_connection_refused():
    refused = ClientConfig(f"http://127.0.0.1:{free_port()}", "chat", MODEL)
    (record,) = send_all(refused, count=1)
    assert (record.success, record.error_kind) == (False, "ConnectError")


def test_slow_request_times_out(fake_server):
    server = fake_server(lambda i, _r: Behaviour() if i == 0 else Behaviour(first_token_delay=2))
    start = time.perf_counter()
    (record,) = send_all(ClientConfig(server.base_url, "chat", MODEL, timeout_s=0.2), count=1)
    assert record.error_kind == "Timeout"
    assert time.perf_counter() - start < 1.5
