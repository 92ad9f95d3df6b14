"""Result files (one JSON per run: configuration, software versions, summary, per-request
records) and the terminal tables: one run, a sweep, and a side-by-side comparison."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import math
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gossamer.bench.client import RequestRecord
from gossamer.bench.errors import BenchConfigError

SCHEMA = "gossamer-bench/1"
_VERSIONED_PACKAGES = ("gossamer", "httpx", "numpy", "tqdm", "tokenizers", "matplotlib")
_LATENCY_SECTIONS = (
    ("ttft", "TTFT", "Time to First Token (reasoning or content)"),
    ("ttfct", "TTFCT", "Time to First Content Token"),
    ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
    ("itl", "ITL", "Inter-token Latency"),
    ("e2el", "E2EL", "End-to-end Latency"),
)


def software_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": sys.version.split()[0]}
    versions["platform"] = platform.platform()
    for package in _VERSIONED_PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    if versions["gossamer"] is None:  # running from a checkout that is not pip-installed
        import gossamer

        versions["gossamer"] = gossamer.__version__
    return versions


def build_result(
    label: str,
    config: dict[str, Any],
    server: dict[str, Any],
    summary: dict[str, Any],
    records: Sequence[RequestRecord],
    warmup: Sequence[RequestRecord],
    save_text: bool = False,
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "label": label,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "config": config,
        "versions": software_versions(),
        "server": server,
        "warmup": {"requests": len(warmup), "failed": sum(not r.success for r in warmup)},
        "summary": summary,
        "requests": [r.to_json(save_text) for r in records],
    }


def write_result(path: Path, result: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=_json_default))
    return path


def load_result(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        result = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise BenchConfigError(f"cannot read result file {path}: {exc}") from exc
    if not isinstance(result, dict) or result.get("schema") != SCHEMA:
        raise BenchConfigError(f"{path} is not a `gossamer bench` result file ({SCHEMA})")
    return result


def result_filename(label: str, concurrency: int | None, request_rate: float) -> str:
    parts = [_safe(label), f"c{concurrency if concurrency else 'inf'}"]
    if not math.isinf(request_rate):
        parts.append(f"r{request_rate:g}")
    return "-".join(parts) + ".json"


def run_table(result: dict[str, Any]) -> str:
    """One run, laid out like vLLM's "Serving Benchmark Result" block."""
    summary, config = result["summary"], result["config"]
    lines = [" Serving Benchmark Result ".center(56, "=")]
    rows: list[tuple[str, Any]] = [
        ("Label:", result["label"]),
        ("Endpoint / workload:", f"{config['endpoint']} / {config['workload']['name']}"),
        ("Maximum request concurrency:", config["concurrency"] or "none"),
        ("Request rate configured (RPS):", config_rate(config)),
        ("Successful requests:", summary["completed"]),
        ("Failed requests:", summary["failed"]),
        ("Benchmark duration (s):", summary["duration"]),
        ("Total input tokens:", summary["total_input_tokens"]),
        ("Total generated tokens:", summary["total_output_tokens"]),
        ("  of which reasoning / content:", _pair(summary)),
        ("Request throughput (req/s):", summary["request_throughput"]),
        ("Request goodput (req/s):", summary["request_goodput"]),
        ("Output token throughput (tok/s):", summary["output_throughput"]),
        ("Input token throughput (tok/s):", summary["input_throughput"]),
        ("Total token throughput (tok/s):", summary["total_token_throughput"]),
        ("Median output tok/s per user:", summary["median_output_tokens_per_s_per_user"]),
        ("Peak concurrent requests:", summary["max_concurrent_requests"]),
    ]
    lines += [f"{name:<42} {_fmt(value)}" for name, value in rows if value is not None]
    for key, short, title in _LATENCY_SECTIONS:
        lines.append(f"{title:-^56}")
        for stat in ("mean", "median", *_percentile_names(summary, key)):
            name = f"{stat.capitalize() if stat[0] != 'p' else stat.upper()} {short} (ms):"
            lines.append(f"{name:<42} {_fmt(summary.get(f'{stat}_{key}_ms'))}")
    if summary["errors"]:
        lines.append(f"{'Errors':-^56}")
        for kind, count in summary["errors"].items():
            lines.append(f"{kind + ':':<42} {count}")
            lines.append(f"  e.g. {summary['error_examples'].get(kind, '')[:100]}")
    lines.append("=" * 56)
    return "\n".join(lines)


def sweep_table(results: Sequence[dict[str, Any]]) -> str:
    """One row per run of a sweep."""
    header = (
        "conc", "rate", "ok", "fail", "req/s", "out tok/s", "tok/s/user",
        "TTFT p50", "TTFCT p50", "TPOT p50", "ITL p50", "E2EL p50",
    )  # fmt: skip
    keys = (
        "completed", "failed", "request_throughput", "output_throughput",
        "median_output_tokens_per_s_per_user", "median_ttft_ms", "median_ttfct_ms",
        "median_tpot_ms", "median_itl_ms", "median_e2el_ms",
    )  # fmt: skip
    rows = [
        [_fmt(r["config"]["concurrency"] or "inf"), _fmt(config_rate(r["config"]))]
        + [_fmt(r["summary"].get(k)) for k in keys]
        for r in results
    ]
    return _grid([list(header), *rows])


COMPARE_ROWS: tuple[tuple[str, str], ...] = (
    ("completed", "Successful requests"),
    ("failed", "Failed requests"),
    ("duration", "Duration (s)"),
    ("request_throughput", "Request throughput (req/s)"),
    ("request_goodput", "Request goodput (req/s)"),
    ("output_throughput", "Output tok/s"),
    ("input_throughput", "Input tok/s"),
    ("total_token_throughput", "Total tok/s"),
    ("median_output_tokens_per_s_per_user", "Median tok/s per user"),
    ("total_reasoning_tokens", "Reasoning tokens"),
    ("total_content_tokens", "Content tokens"),
)


def compare_table(results: Sequence[dict[str, Any]]) -> str:
    """Metrics down, runs across."""
    header = ["metric"] + [run_name(r) for r in results]
    rows = [["endpoint"] + [r["config"]["endpoint"] for r in results]]
    rows.append(["workload"] + [r["config"]["workload"]["name"] for r in results])
    rows += [
        [title] + [_fmt(r["summary"].get(key)) for r in results] for key, title in COMPARE_ROWS
    ]
    for key, short, _ in _LATENCY_SECTIONS:
        stats = ["mean", "median"]
        for r in results:
            stats += [p for p in _percentile_names(r["summary"], key) if p not in stats]
        for stat in stats:
            title = f"{stat} {short} (ms)"
            rows.append([title] + [_fmt(r["summary"].get(f"{stat}_{key}_ms")) for r in results])
    return _grid([header, *rows])


def run_name(result: dict[str, Any]) -> str:
    config = result["config"]
    name = f"{result['label']} c={config['concurrency'] or 'inf'}"
    if not math.isinf(config_rate(config)):
        name += f" r={config_rate(config):g}"
    return name


def config_rate(config: dict[str, Any]) -> float:
    """Request rate of a run; stored as null for "unlimited" since JSON has no infinity."""
    rate = config.get("request_rate")
    return math.inf if rate is None else float(rate)


def _percentile_names(summary: dict[str, Any], key: str) -> list[str]:
    suffix = f"_{key}_ms"
    names = [k.removesuffix(suffix) for k in summary if k.startswith("p") and k.endswith(suffix)]
    return sorted(names, key=lambda name: float(name[1:]))


def _pair(summary: dict[str, Any]) -> str:
    return f"{summary['total_reasoning_tokens']} / {summary['total_content_tokens']}"


def _grid(rows: list[list[str]]) -> str:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(str(cell).rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.2f}"
    return str(value)


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._" else "_" for c in text) or "run"


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} to a result file")
