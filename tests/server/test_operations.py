"""Health, models, /metrics, and aborting engine requests when the client goes away."""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import ALIAS, API_KEY, MODEL, ServerThread, wait_until
from tests.server.fake_engine import FakeEngine

AUTH = {"Authorization": f"Bearer {API_KEY}"}
USER = [{"role": "user", "content": "hi"}]
LONG_ANSWER = "<|channel|>final<|message|>" + " ".join(f"w{i}" for i in range(200)) + "<|return|>"


def test_health_follows_engine_readiness(
    client: openai.OpenAI, server: ServerThread, engine: FakeEngine
) -> None:
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    engine.ready = False
    assert httpx.get(f"{server.base_url}/health").status_code == 503
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model=MODEL, messages=USER)
    assert caught.value.status_code == 503
    engine.ready = True
    assert httpx.get(f"{server.base_url}/health").status_code == 200


def test_models(client: openai.OpenAI, engine: FakeEngine) -> None:
    models = client.models.list().data
    assert [model.id for model in models] == [MODEL, ALIAS]
    assert all(model.owned_by == "gossamer" for model in models)


def _metrics(server: ServerThread) -> dict[str, float]:
    text = httpx.get(f"{server.base_url}/metrics").text
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}"] = sample.value
    return values


def test_metrics_move(client: openai.OpenAI, server: ServerThread, engine: FakeEngine) -> None:
    before = _metrics(server)
    chat_ok = "gossamer_requests_total{endpoint=/v1/chat/completions,status=200}"
    chat_404 = "gossamer_requests_total{endpoint=/v1/chat/completions,status=404}"
    ttft_count = "gossamer_time_to_first_token_seconds_count{endpoint=/v1/chat/completions}"
    e2e_count = "gossamer_e2e_request_latency_seconds_count{endpoint=/v1/chat/completions}"
    tpot_count = "gossamer_time_per_output_token_seconds_count{endpoint=/v1/chat/completions}"
    completion = client.chat.completions.create(model=MODEL, messages=USER)
    list(client.chat.completions.create(model=MODEL, messages=USER, stream=True))
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=USER)
    after = _metrics(server)
    assert after[chat_ok] - before.get(chat_ok, 0) == 2
    assert after[chat_404] - before.get(chat_404, 0) == 1
    for name in (ttft_count, e2e_count, tpot_count):
        assert after[name] - before.get(name, 0) == 2
    tokens = completion.usage.completion_tokens
    generated = "gossamer_request_generation_tokens_total{endpoint=/v1/chat/completions}"
    assert after[generated] - before.get(generated, 0) == 2 * tokens
    # engine gauges and counters, read from engine.stats()
    assert (
        after["gossamer_generation_tokens_total{}"] - before["gossamer_generation_tokens_total{}"]
        == 2 * tokens
    )
    assert after["gossamer_prompt_tokens_total{}"] > before["gossamer_prompt_tokens_total{}"]
    graph_steps = "gossamer_runner_steps_total{mode=graph}"
    assert after[graph_steps] > before.get(graph_steps, 0)
    for gauge in (
        "num_requests_running",
        "num_requests_waiting",
        "kv_cache_usage_perc",
        "prefix_cache_hit_rate",
    ):
        assert f"gossamer_{gauge}{{}}" in after


def test_engine_gauges_are_live(server: ServerThread, engine: FakeEngine) -> None:
    engine.script = lambda prompt, index: LONG_ANSWER
    engine.token_delay = 0.01
    engine.cached_tokens = 5
    body = {"model": MODEL, "messages": USER, "stream": True}
    with httpx.stream(
        "POST", f"{server.base_url}/v1/chat/completions", json=body, headers=AUTH
    ) as response:
        lines = response.iter_lines()  # NOTE: dropping the iterator would close the connection
        next(lines)
        running = _metrics(server)
    assert running["gossamer_num_requests_running{}"] == 1
    assert running["gossamer_kv_cache_usage_perc{}"] == pytest.approx(0.1)
    assert 0 < running["gossamer_prefix_cache_hit_rate{}"] < 1
    assert running["gossamer_http_requests_in_flight{}"] >= 2  # the stream and the scrape


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"model": MODEL, "messages": USER, "stream": True}),
    ("/v1/completions", {"model": MODEL, "prompt": ["a", "b"], "stream": True, "max_tokens": 500}),
    ("/v1/responses", {"model": MODEL, "input": "hi", "stream": True}),
])  # fmt: skip
def test_disconnect_mid_stream_aborts(
    server: ServerThread, engine: FakeEngine, path: str, body: dict
) -> None:
    engine.script = lambda prompt, index: LONG_ANSWER
    engine.token_delay = 0.01
    with httpx.stream("POST", f"{server.base_url}{path}", json=body, headers=AUTH) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        for _ in range(6):
            next(lines)
    # the response is closed here: the connection is gone mid-stream
    request_ids = {seen.request_id for seen in engine.seen}
    assert len(request_ids) == (2 if path == "/v1/completions" else 1)
    assert wait_until(lambda: request_ids <= set(engine.aborted))
    assert wait_until(lambda: request_ids <= set(engine.closed_early))
    assert wait_until(lambda: not engine.active)


def test_disconnect_while_waiting_for_a_non_streaming_answer_aborts(
    server: ServerThread, engine: FakeEngine
) -> None:
    engine.script = lambda prompt, index: LONG_ANSWER
    engine.token_delay = 0.02
    body = {"model": MODEL, "messages": USER}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/v1/chat/completions", json=body, headers=AUTH, timeout=0.3)
    assert wait_until(lambda: len(engine.seen) == 1 and engine.seen[0].request_id in engine.aborted)
    assert wait_until(lambda: not engine.active)
    assert engine.closed_early == [engine.seen[0].request_id]


def test_disconnect_before_the_first_token_aborts(server: ServerThread, engine: FakeEngine) -> None:
    engine.token_delay = 1.0  # the first token is a second away (e.g. a long queue)
    body = {"model": MODEL, "messages": USER, "stream": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/v1/chat/completions", json=body, headers=AUTH, timeout=0.2)
    assert wait_until(
        lambda: len(engine.seen) == 1 and engine.seen[0].request_id in engine.aborted, 0.7
    )


def test_finished_requests_are_not_aborted(client: openai.OpenAI, engine: FakeEngine) -> None:
    client.chat.completions.create(model=MODEL, messages=USER)
    list(client.chat.completions.create(model=MODEL, messages=USER, stream=True))
    client.completions.create(model=MODEL, prompt=["a", "b"], max_tokens=3)
    list(client.responses.create(model=MODEL, input="x", stream=True))
    assert len(engine.seen) == 5
    assert engine.aborted == [] and engine.closed_early == []
