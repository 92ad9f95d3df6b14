"""Metric arithmetic on hand-made records (no server): every expected number is worked out by
hand from the vLLM definitions, not computed by the code under test."""

from __future__ import annotations

import pytest

from gossamer.bench.client import RequestRecord
from gossamer.bench.errors import BenchConfigError
from gossamer.bench.metrics import (
    Slo,
    distribution,
    fill_missing_token_counts,
    peak_concurrency,
    request_tpot,
    summarize,
)
from gossamer.bench.prompts import WordPromptBuilder


def finished(request_id, start, ttft, itl, output_tokens, input_tokens, reasoning=0, ttfct=None):
    return RequestRecord(
        request_id=request_id,
        conversation_id=request_id,
        turn=0,
        max_output_tokens=output_tokens,
        prompt_tokens_estimate=999,  # must lose to the server's usage count
        start_time=start,
        success=True,
        ttft=ttft,
        ttfct=ttft if ttfct is None else ttfct,
        e2el=ttft + sum(itl),
        itl=list(itl),
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        reasoning_tokens=reasoning,
    )


def failed(request_id, kind="HTTP 500"):
    record = RequestRecord(request_id, request_id, 0, 8, 10)
    record.fail(kind, f"{kind}: boom")
    return record


@pytest.fixture
def records():
    return [
        # ttft 100 ms, 4 gaps of 20 ms, 5 tokens -> e2el 180 ms, TPOT 80/4 = 20 ms
        finished(
            0,
            start=0.00,
            ttft=0.1,
            itl=[0.02] * 4,
            output_tokens=5,
            input_tokens=10,
            reasoning=2,
            ttfct=0.14,
        ),
        # ttft 300 ms, 2 gaps of 50 ms, 3 tokens -> e2el 400 ms, TPOT 100/2 = 50 ms
        finished(1, start=0.05, ttft=0.3, itl=[0.05, 0.05], output_tokens=3, input_tokens=20),
        # one token: no TPOT; e2el = ttft = 200 ms
        finished(2, start=0.50, ttft=0.2, itl=[], output_tokens=1, input_tokens=30),
        failed(3),
    ]


def test_counts_and_throughputs(records):
    summary = summarize(records, duration_s=2.0)
    assert (summary["completed"], summary["failed"]) == (3, 1)
    assert summary["total_input_tokens"] == 60  # usage counts, not the 999 estimates
    assert summary["total_output_tokens"] == 9
    assert summary["total_reasoning_tokens"] == 2
    assert summary["total_content_tokens"] == 7
    assert summary["request_throughput"] == pytest.approx(1.5)
    assert summary["output_throughput"] == pytest.approx(4.5)
    assert summary["input_throughput"] == pytest.approx(30.0)
    assert summary["total_token_throughput"] == pytest.approx(34.5)
    assert summary["errors"] == {"HTTP 500": 1}
    assert summary["error_examples"]["HTTP 500"] == "HTTP 500: boom"
    assert summary["request_goodput"] is None  # no SLO given


def test_latency_statistics(records):
    summary = summarize(records, duration_s=2.0, percentiles=(50, 99))
    # TTFT over successes: 100, 300, 200 ms; linear interpolation: p99 = 200 + 0.98 * 100
    assert summary["mean_ttft_ms"] == pytest.approx(200.0)
    assert summary["median_ttft_ms"] == pytest.approx(200.0)
    assert summary["p99_ttft_ms"] == pytest.approx(298.0)
    assert summary["p50_ttft_ms"] == pytest.approx(200.0)
    # TTFCT: 140, 300, 200 ms
    assert summary["mean_ttfct_ms"] == pytest.approx(640.0 / 3)
    # TPOT excludes the first token and requests with a single token: 20 and 50 ms
    assert summary["mean_tpot_ms"] == pytest.approx(35.0)
    assert summary["median_tpot_ms"] == pytest.approx(35.0)
    # ITL pools every gap of every request: 20, 20, 20, 20, 50, 50
    assert summary["mean_itl_ms"] == pytest.approx(30.0)
    assert summary["median_itl_ms"] == pytest.approx(20.0)
    assert summary["std_itl_ms"] == pytest.approx((((10**2) * 4 + (20**2) * 2) / 6) ** 0.5)
    # E2EL: 180, 400, 200 ms
    assert summary["mean_e2el_ms"] == pytest.approx(260.0)
    # per-user speed = 1 / TPOT: 50 and 20 tok/s
    assert summary["mean_output_tokens_per_s_per_user"] == pytest.approx(35.0)
    assert summary["median_output_tokens_per_s_per_user"] == pytest.approx(35.0)
    # in flight: [0, .18), [.05, .45), [.5, .7) -> at most 2 at once
    assert summary["max_concurrent_requests"] == 2


def test_goodput_counts_requests_meeting_every_slo(records):
    slo = Slo.parse("ttft_ms=250,tpot_ms=30")
    # request 0: 100 ms / 20 ms -> good; 1: TTFT 300 -> bad; 2: 200 ms, one token (TPOT 0) -> good
    assert summarize(records, 2.0, slo=slo)["request_goodput"] == pytest.approx(1.0)
    assert summarize(records, 2.0, slo=Slo(e2el_ms=190))["request_goodput"] == pytest.approx(0.5)
    assert summarize(records, 2.0, slo=Slo(ttfct_ms=150))["request_goodput"] == pytest.approx(0.5)


def test_tpot_of_single_request():
    record = finished(0, 0.0, ttft=0.5, itl=[0.1, 0.3], output_tokens=5, input_tokens=1)
    # 4 tokens after the first in 0.4 s, whatever the chunking (ITL has only 2 gaps)
    assert request_tpot(record) == pytest.approx(0.1)
    assert request_tpot(failed(1)) is None


def test_all_failed_gives_none_statistics_and_zero_throughput():
    summary = summarize([failed(0), failed(1, "ConnectError")], duration_s=1.0)
    assert summary["completed"] == 0 and summary["failed"] == 2
    assert summary["errors"] == {"HTTP 500": 1, "ConnectError": 1}
    assert summary["mean_ttft_ms"] is None and summary["p99_itl_ms"] is None
    assert summary["request_throughput"] == 0.0
    assert summary["max_concurrent_requests"] == 0


def test_distribution_names_fractional_percentiles():
    stats = distribution([1.0, 2.0, 3.0, 4.0], percentiles=(99.9, 90), scale=1000.0)
    assert set(stats) == {"mean", "median", "std", "p99.9", "p90"}
    assert stats["p90"] == pytest.approx(3700.0)  # 3 + 0.7 * 1, in ms


def test_peak_concurrency_half_open_intervals():
    back_to_back = [
        finished(i, start=0.1 * i, ttft=0.1, itl=[], output_tokens=1, input_tokens=1)
        for i in range(3)
    ]
    assert peak_concurrency(back_to_back) == 1


def test_slo_parse_rejects_unknown_names_and_values():
    assert Slo.parse("ttft_ms=500, tpot_ms=20.5") == Slo(ttft_ms=500.0, tpot_ms=20.5)
    assert Slo.parse(None) is None
    for bad in ("ttft=500", "ttft_ms", "latency_ms=3", "tpot_ms=fast"):
        with pytest.raises(BenchConfigError):
            Slo.parse(bad)


def test_missing_usage_is_counted_from_stream_events_or_tokenizer():
    record = finished(0, 0.0, ttft=0.1, itl=[0.01] * 3, output_tokens=0, input_tokens=None)
    record.output_tokens = record.reasoning_tokens = None
    record.num_content_events, record.num_reasoning_events = 3, 1
    record.content_text, record.reasoning_text = "alpha beta gamma", "think"
    fill_missing_token_counts([record], WordPromptBuilder())
    assert (record.output_tokens, record.output_tokens_source) == (4, "events")
    assert (record.reasoning_tokens, record.reasoning_tokens_source) == (1, "events")

    class WhitespaceTokenizer:
        exact = True

        def count(self, text):
            return len(text.split())

    record.output_tokens = record.reasoning_tokens = None
    fill_missing_token_counts([record], WhitespaceTokenizer())
    assert (record.output_tokens, record.output_tokens_source) == (4, "tokenizer")
    assert record.reasoning_tokens == 1
