"""The load generator against the live fake server: concurrency cap, warm-up, arrivals,
duration, multi-turn history, and a run that goes on through failures."""

from __future__ import annotations

import asyncio
import itertools
import statistics

import pytest

from gossamer.bench.client import ClientConfig
from gossamer.bench.errors import BenchConfigError
from gossamer.bench.loadgen import LoadConfig, arrival_gaps, run_load
from gossamer.bench.metrics import summarize
from gossamer.bench.prompts import WordPromptBuilder
from gossamer.bench.workloads import WorkloadSpec, conversations
from tests.bench.fake_openai_server import MODEL, Behaviour, free_port


def run(config: ClientConfig, load: LoadConfig, spec: WorkloadSpec | None = None):
    spec = spec or WorkloadSpec(name="random", input_len=8, output_len=4)
    builder = WordPromptBuilder()
    stream = conversations(spec, builder, seed=0)
    warmup = conversations(spec, builder, seed=1)
    return asyncio.run(run_load(config, load, stream, warmup))


def test_concurrency_cap_warmup_and_counts(fake_server):
    server = fake_server(Behaviour(token_delay=0.01))
    load = LoadConfig(concurrency=3, num_requests=12, num_warmup=2, show_progress=False)
    outcome = run(ClientConfig(server.base_url, "chat", MODEL), load)
    assert [r.request_id for r in outcome.records] == list(range(12))
    assert all(r.success for r in outcome.records)
    assert len(outcome.warmup_records) == 2
    assert len(server.posts) == 14  # warm-up requests were sent but are not counted
    assert server.max_in_flight == 3
    summary = summarize(outcome.records, outcome.duration_s)
    assert summary["completed"] == 12 and summary["total_output_tokens"] == 48
    assert summary["max_concurrent_requests"] == 3
    # warm-up prompts come from another seed: none of the measured prompts was pre-sent
    warm = {p.body["messages"][-1]["content"] for p in server.posts[:2]}
    assert not warm & {p.body["messages"][-1]["content"] for p in server.posts[2:]}


def test_arrival_gaps_follow_the_gamma_process():
    def stats(burstiness):
        gaps = list(itertools.islice(arrival_gaps(10.0, burstiness, seed=0), 4000))
        mean = statistics.fmean(gaps)
        return mean, statistics.pstdev(gaps) / mean

    mean, cv = stats(1.0)  # Poisson: exponential gaps, coefficient of variation 1
    assert mean == pytest.approx(0.1, rel=0.05) and cv == pytest.approx(1.0, abs=0.07)
    mean, cv = stats(4.0)  # gamma shape k: cv = 1 / sqrt(k)
    assert mean == pytest.approx(0.1, rel=0.05) and cv == pytest.approx(0.5, abs=0.05)
    assert list(itertools.islice(arrival_gaps(float("inf"), 1.0, 0), 3)) == [0.0, 0.0, 0.0]
    same = list(itertools.islice(arrival_gaps(5.0, 1.0, seed=3), 5))
    assert same == list(itertools.islice(arrival_gaps(5.0, 1.0, seed=3), 5))


def test_poisson_arrivals_are_sent_on_schedule(fake_server):
    server = fake_server(Behaviour())
    load = LoadConfig(
        concurrency=None,
        request_rate=40.0,
        num_requests=8,
        num_warmup=0,
        seed=5,
        show_progress=False,
    )
    outcome = run(ClientConfig(server.base_url, "completions", MODEL), load)
    expected = list(itertools.accumulate(itertools.islice(arrival_gaps(40.0, 1.0, 5), 8)))
    for record, due in zip(outcome.records, expected, strict=True):
        assert record.scheduled_time == pytest.approx(due)
        assert due - 0.002 <= record.start_time <= due + 0.03
    assert outcome.duration_s >= expected[-1]


def test_duration_mode_stops_sending_when_time_is_up(fake_server):
    server = fake_server(Behaviour(token_delay=0.02))  # 4 tokens: about 60 ms a request
    load = LoadConfig(
        concurrency=2, num_requests=None, duration_s=0.3, num_warmup=0, show_progress=False
    )
    outcome = run(ClientConfig(server.base_url, "chat", MODEL), load)
    assert 4 <= len(outcome.records) <= 12
    assert all(r.success for r in outcome.records)
    assert max(r.start_time for r in outcome.records) < 0.3
    assert outcome.duration_s < 0.3 + 0.3  # in-flight requests finish, no new ones start


def test_multiturn_carries_answers_but_not_reasoning(fake_server):
    server = fake_server(Behaviour(reasoning_tokens=1))
    spec = WorkloadSpec(name="multiturn", input_len=4, output_len=3, turns=3)
    load = LoadConfig(concurrency=1, num_requests=3, num_warmup=0, show_progress=False)
    outcome = run(ClientConfig(server.base_url, "chat", MODEL), load, spec)
    assert [r.turn for r in outcome.records] == [0, 1, 2]
    last = server.posts[-1].body["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "user", "assistant", "user"]
    assert last[1]["content"] == "c1 c2 "  # the content of turn 0; its reasoning "r0 " dropped
    # the prompt grows with the history: 4 user words, then + 2 answer words + 4 user words
    assert [r.input_tokens for r in outcome.records] == [4, 10, 16]  # server counts words
    assert [r.prompt_tokens_estimate for r in outcome.records] == [4, 10, 16]


def test_failed_turn_skips_the_rest_of_its_conversation(fake_server):
    server = fake_server(lambda i, _r: Behaviour(status=500) if i == 0 else Behaviour())
    spec = WorkloadSpec(name="multiturn", input_len=4, output_len=3, turns=3)
    load = LoadConfig(concurrency=1, num_requests=6, num_warmup=0, show_progress=False)
    outcome = run(ClientConfig(server.base_url, "chat", MODEL), load, spec)
    kinds = [r.error_kind for r in outcome.records]
    assert kinds == ["HTTP 500", "Skipped", "Skipped", "", "", ""]
    assert len(server.posts) == 4


def test_mixed_failures_are_counted_and_the_run_goes_on(fake_server):
    def policy(index, _request):
        if index % 4 == 1:
            return Behaviour(status=429)
        if index % 4 == 2:
            return Behaviour(cut_after=2)
        return Behaviour()

    server = fake_server(policy)
    load = LoadConfig(concurrency=1, num_requests=12, num_warmup=0, show_progress=False)
    outcome = run(ClientConfig(server.base_url, "responses", MODEL), load)
    summary = summarize(outcome.records, outcome.duration_s)
    assert summary["completed"] == 6 and summary["failed"] == 6
    assert summary["errors"] == {"HTTP 429": 3, "RemoteProtocolError": 3}
    assert summary["total_output_tokens"] == 6 * 4


def test_connection_refused_run_completes_with_every_request_failed():
    config = ClientConfig(f"http://127.0.0.1:{free_port()}", "chat", MODEL)
    load = LoadConfig(concurrency=4, num_requests=10, num_warmup=1, show_progress=False)
    outcome = run(config, load)
    assert len(outcome.records) == 10
    assert {r.error_kind for r in outcome.records} == {"ConnectError"}


@pytest.mark.parametrize(
    "load",
    [
        LoadConfig(num_requests=None, duration_s=None),
        LoadConfig(num_requests=5, duration_s=1.0),
        LoadConfig(concurrency=0),
        LoadConfig(concurrency=None),  # neither a cap nor a rate: would send all at once
        LoadConfig(request_rate=-1.0),
    ],
)
def test_invalid_load_configs(load):
    with pytest.raises(BenchConfigError):
        load.validate()
