"""Prometheus metrics for `/metrics`, in a registry private to one app (tests build many apps).

Request-level numbers (counts, latencies, tokens per endpoint) are recorded by the server as
requests pass. Engine-level numbers (running/waiting requests, KV cache use, prefix cache,
cumulative tokens) are read from `engine.stats()` at scrape time by a custom collector, so the
engine needs no Prometheus code and the values are never stale.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gossamer.engine.outputs import EngineStats

PREFIX = "gossamer_"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Seconds; the same spread as vLLM's, so dashboards can compare the two.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
TPOT_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
)
E2E_BUCKETS = (
    0.01,
    0.05,
    0.1,
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
)


class ServerMetrics:
    def __init__(self, stats: Callable[[], EngineStats]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self.requests = Counter(
            f"{PREFIX}requests",
            "HTTP requests by endpoint and status code",
            ["endpoint", "status"],
            registry=registry,
        )
        self.in_flight = Gauge(
            f"{PREFIX}http_requests_in_flight", "HTTP requests being served", registry=registry
        )
        self.ttft = Histogram(
            f"{PREFIX}time_to_first_token_seconds",
            "Request arrival to its first token",
            ["endpoint"],
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.tpot = Histogram(
            f"{PREFIX}time_per_output_token_seconds",
            "Mean time between output tokens of a choice",
            ["endpoint"],
            buckets=TPOT_BUCKETS,
            registry=registry,
        )
        self.e2e = Histogram(
            f"{PREFIX}e2e_request_latency_seconds",
            "Request arrival to its last token",
            ["endpoint"],
            buckets=E2E_BUCKETS,
            registry=registry,
        )
        self.prompt_tokens = Counter(
            f"{PREFIX}request_prompt_tokens",
            "Prompt tokens of finished requests",
            ["endpoint"],
            registry=registry,
        )
        self.generation_tokens = Counter(
            f"{PREFIX}request_generation_tokens",
            "Output tokens of finished requests",
            ["endpoint"],
            registry=registry,
        )
        self.harmony_anomalies = Counter(
            f"{PREFIX}harmony_parse_anomalies",
            "Off-format model output the parser recovered from",
            ["kind"],
            registry=registry,
        )
        registry.register(EngineStatsCollector(stats))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class EngineStatsCollector(Collector):
    """Gauges and counters read from `engine.stats()` at each scrape."""

    def __init__(self, stats: Callable[[], EngineStats]) -> None:
        self._stats = stats

    def describe(self) -> list[Metric]:
        return []  # names are only known by collecting; an empty list skips that at register

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        yield _gauge("num_requests_running", "Requests being computed", stats.num_running)
        yield _gauge("num_requests_waiting", "Requests waiting to be scheduled", stats.num_waiting)
        yield _gauge(
            "kv_cache_usage_perc", "Fraction of KV cache blocks in use", stats.kv_cache_usage
        )
        hit_rate = (
            stats.prefix_cache_hits / stats.prefix_cache_queries
            if stats.prefix_cache_queries
            else 0.0
        )
        yield _gauge(
            "prefix_cache_hit_rate", "Prefix cache hits / queries, in tokens, cumulative", hit_rate
        )
        yield _counter(
            "prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache",
            stats.prefix_cache_queries,
        )
        yield _counter(
            "prefix_cache_hits", "Prompt tokens found in the prefix cache", stats.prefix_cache_hits
        )
        yield _counter(
            "prompt_tokens",
            "Prompt tokens computed by the engine (cache hits excluded)",
            stats.prompt_tokens,
        )
        yield _counter(
            "generation_tokens", "Tokens generated by the engine", stats.generation_tokens
        )
        yield _counter(
            "num_preemptions", "Requests preempted for KV cache space", stats.num_preemptions
        )
        if stats.runner_steps:
            steps = CounterMetricFamily(
                f"{PREFIX}runner_steps",
                "Model steps by how they ran: graph (a CUDA graph replayed) or eager_<reason>",
                labels=["mode"],
            )
            for mode, count in sorted(stats.runner_steps.items()):
                steps.add_metric([mode], float(count))
            yield steps
        if stats.spec_stats:
            spec = GaugeMetricFamily(
                f"{PREFIX}spec_decode", "Speculative decoding statistics", labels=["stat"]
            )
            for name, value in sorted(stats.spec_stats.items()):
                spec.add_metric([name], float(value))
            yield spec


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}{name}", documentation, value=float(value))


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(f"{PREFIX}{name}", documentation, value=float(value))


class RequestCountMiddleware:
    """Pure ASGI middleware: counts every HTTP request by route and status (errors included),
    and keeps the in-flight gauge. Unknown paths share one label to bound cardinality."""

    def __init__(self, app, metrics: ServerMetrics) -> None:  # type: ignore[no-untyped-def]
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # stays 500 when the app raises before starting a response

        async def send_and_record(message) -> None:  # type: ignore[no-untyped-def]
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, receive, send_and_record)
        finally:
            self.metrics.in_flight.dec()
            route = scope.get("route")
            endpoint = getattr(route, "path", None) or "other"
            self.metrics.requests.labels(endpoint, str(status)).inc()
