"""Request records -> the run's summary. Names and meanings follow `vllm bench serve`
(vllm/benchmarks/serve.py, `calculate_metrics`) so numbers can sit beside theirs:

- TTFT: send -> first streamed event carrying generated text. Headline TTFT counts reasoning
  text too (as vLLM does: a reasoning delta is a token); TTFCT (time to first *content* token)
  is reported beside it because GPT-OSS reasons before it answers.
- TPOT: (e2el - ttft) / (output_tokens - 1), i.e. it excludes the first token; only requests with
  more than one output token enter its statistics (for goodput the others count as TPOT 0).
- ITL: the gaps between successive streamed token events, pooled over all requests. An event
  can hold several tokens, so ITL may be larger than TPOT.
- E2EL: send -> last token event.
- Throughputs divide by the run's duration (first send -> last request done) and count only
  successful requests: request/s, output tok/s, input tok/s, total (input + output) tok/s.
- Goodput: successful requests meeting every SLO (value <= limit) per second.
- Output tok/s per user: 1 / TPOT of each request (the decode speed one user sees); its mean,
  median and percentiles are over requests. vLLM has no such metric; it is our addition.

Differences from vLLM: statistics of an empty set are None (vLLM reports 0); tokens are counted
from `usage` (vLLM too) and, when a server sends none, with `--tokenizer` or else one token per
streamed event (vLLM counts 1 token without a tokenizer).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from gossamer.bench.client import RequestRecord
from gossamer.bench.errors import BenchConfigError
from gossamer.bench.prompts import PromptBuilder

DEFAULT_PERCENTILES: tuple[float, ...] = (90.0, 99.0)
HEADLINE_TTFT = "first token of any kind, reasoning or content (as vLLM); TTFCT = first content"
LATENCY_METRICS = ("ttft", "ttfct", "tpot", "itl", "e2el")
_MAX_ERROR_EXAMPLES = 5


@dataclass(frozen=True)
class Slo:
    """Service level objectives for goodput, in milliseconds; None = not constrained."""

    ttft_ms: float | None = None
    ttfct_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    @classmethod
    def parse(cls, text: str | None) -> Slo | None:
        """`"ttft_ms=500,tpot_ms=50"` -> Slo(ttft_ms=500, tpot_ms=50)."""
        if not text:
            return None
        names = {f.name for f in fields(cls)}
        values: dict[str, float] = {}
        for item in text.split(","):
            name, sep, value = item.strip().partition("=")
            if not sep or name not in names:
                raise BenchConfigError(
                    f"bad --slo item {item!r}: use NAME=MILLISECONDS with NAME in {sorted(names)}"
                )
            try:
                values[name] = float(value)
            except ValueError:
                raise BenchConfigError(
                    f"--slo {name} needs a number of ms, got {value!r}"
                ) from None
        return cls(**values)

    def is_met(self, record: RequestRecord) -> bool:
        tpot = request_tpot(record) or 0.0  # vLLM: TPOT of a <=1-token answer counts as 0
        checks = (
            (self.ttft_ms, record.ttft),
            (self.ttfct_ms, record.ttfct),
            (self.tpot_ms, tpot),
            (self.e2el_ms, record.e2el),
        )
        return all(
            limit is None or (value is not None and value * 1000.0 <= limit)
            for limit, value in checks
        )


def fill_missing_token_counts(records: Sequence[RequestRecord], counter: PromptBuilder) -> None:
    """Token counts for successful requests whose server sent no `usage` (or no reasoning
    details): counted with the tokenizer when there is one, else one token per streamed event."""
    for record in records:
        if not record.success:
            continue
        if record.output_tokens is None:
            if counter.exact:  # the two channels are tokenized apart, as generated
                count = counter.count(record.reasoning_text) + counter.count(record.content_text)
                record.output_tokens, record.output_tokens_source = count, "tokenizer"
            else:
                events = record.num_content_events + record.num_reasoning_events
                record.output_tokens, record.output_tokens_source = events, "events"
        if record.reasoning_tokens is None:
            if counter.exact:
                record.reasoning_tokens = counter.count(record.reasoning_text)
                record.reasoning_tokens_source = "tokenizer"
            else:
                record.reasoning_tokens = record.num_reasoning_events
                record.reasoning_tokens_source = "events"


def request_tpot(record: RequestRecord) -> float | None:
    """Seconds per output token after the first; None with fewer than 2 output tokens."""
    if not record.success or not record.output_tokens or record.output_tokens < 2:
        return None
    return (record.e2el - record.ttft) / (record.output_tokens - 1)


def input_tokens(record: RequestRecord) -> int:
    """The server's `usage` count when it sent one, else the workload's estimate."""
    return record.input_tokens if record.input_tokens is not None else record.prompt_tokens_estimate


def content_tokens(record: RequestRecord) -> int:
    return max(0, (record.output_tokens or 0) - (record.reasoning_tokens or 0))


def distribution(values: Sequence[float], percentiles: Iterable[float], scale: float = 1.0):
    """mean, median, std and the percentiles (numpy's linear interpolation, as vLLM)."""
    if len(values) == 0:
        return {"mean": None, "median": None, "std": None} | {_p(p): None for p in percentiles}
    array = np.asarray(values, dtype=np.float64) * scale
    stats = {"mean": array.mean(), "median": np.median(array), "std": array.std()}
    stats |= {_p(p): np.percentile(array, p) for p in percentiles}
    return {name: float(value) for name, value in stats.items()}


def summarize(
    records: Sequence[RequestRecord],
    duration_s: float,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    slo: Slo | None = None,
) -> dict[str, Any]:
    """The aggregated metrics of one run; keys follow vLLM's result JSON where one exists."""
    done = [r for r in records if r.success]
    failed = [r for r in records if not r.success]
    total_input = sum(input_tokens(r) for r in done)
    total_output = sum(r.output_tokens or 0 for r in done)
    summary: dict[str, Any] = {
        "duration": duration_s,
        "completed": len(done),
        "failed": len(failed),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "total_reasoning_tokens": sum(r.reasoning_tokens or 0 for r in done),
        "total_content_tokens": sum(content_tokens(r) for r in done),
        "request_throughput": _per_s(len(done), duration_s),
        "request_goodput": _per_s(sum(slo.is_met(r) for r in done), duration_s) if slo else None,
        "output_throughput": _per_s(total_output, duration_s),
        "input_throughput": _per_s(total_input, duration_s),
        "total_token_throughput": _per_s(total_input + total_output, duration_s),
        "max_concurrent_requests": peak_concurrency(done),
        "headline_ttft": HEADLINE_TTFT,
    }
    for name, values in _latency_samples(done).items():
        for stat, value in distribution(values, percentiles, scale=1000.0).items():
            summary[f"{stat}_{name}_ms"] = value
    speeds = [1.0 / t for r in done if (t := request_tpot(r))]
    for stat, value in distribution(speeds, percentiles).items():
        summary[f"{stat}_output_tokens_per_s_per_user"] = value
    summary["errors"] = dict(Counter(r.error_kind for r in failed).most_common())
    summary["error_examples"] = _error_examples(failed)
    return summary


def peak_concurrency(records: Sequence[RequestRecord]) -> int:
    """Most requests in flight at once (sweep over half-open [start, start + e2el))."""
    events = [(r.start_time, 1) for r in records] + [(r.start_time + r.e2el, -1) for r in records]
    in_flight = peak = 0
    for _, step in sorted(events):  # at equal times -1 sorts first: half-open intervals
        in_flight += step
        peak = max(peak, in_flight)
    return peak


def _latency_samples(done: Sequence[RequestRecord]) -> dict[str, list[float]]:
    return {
        "ttft": [r.ttft for r in done],
        "ttfct": [r.ttfct for r in done if r.ttfct is not None],
        "tpot": [t for r in done if (t := request_tpot(r)) is not None],
        "itl": [gap for r in done for gap in r.itl],
        "e2el": [r.e2el for r in done],
    }


def _error_examples(failed: Sequence[RequestRecord]) -> dict[str, str]:
    examples: dict[str, str] = {}
    for record in failed:
        if record.error_kind not in examples and len(examples) < _MAX_ERROR_EXAMPLES:
            examples[record.error_kind] = record.error
    return examples


def _per_s(count: float, duration_s: float) -> float:
    return count / duration_s if duration_s > 0 else 0.0


def _p(percentile: float) -> str:
    return f"p{int(percentile)}" if float(percentile).is_integer() else f"p{percentile:g}"
