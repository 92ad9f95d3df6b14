"""PNG plots for `gossamer bench compare` (matplotlib, imported here only, Agg canvas).

- throughput_vs_per_user.png: total output tok/s against median output tok/s per user, one line
  per label across its concurrency sweep (the serving trade-off curve; up and right is better).
- ttft_cdf.png, itl_cdf.png: cumulative distributions of per-request TTFT and of all ITL gaps,
  one curve per run.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gossamer.bench.errors import BenchConfigError
from gossamer.bench.report import run_name


def write_plots(results: Sequence[dict[str, Any]], out_dir: str | Path) -> list[Path]:
    """Write the comparison PNGs into `out_dir`; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return [
        _throughput_vs_per_user(results, out_dir / "throughput_vs_per_user.png"),
        _cdf(results, "ttft", "TTFT (ms)", out_dir / "ttft_cdf.png"),
        _cdf(results, "itl", "inter-token latency (ms)", out_dir / "itl_cdf.png"),
    ]


def _new_figure():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise BenchConfigError(
            "plots need matplotlib: pip install 'gossamer[bench]' (or pass --no-plots)"
        ) from exc
    # A bare Figure on an Agg canvas: no pyplot, no global backend, no display needed.
    figure = Figure(figsize=(7.0, 4.5), dpi=110, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _throughput_vs_per_user(results, path: Path) -> Path:
    figure = _new_figure()
    axes = figure.add_subplot()
    by_label: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for result in results:
        by_label[result["label"]].append(result)
    for label, runs in by_label.items():
        runs = sorted(runs, key=lambda r: r["config"]["concurrency"] or float("inf"))
        points = [
            (r["summary"]["median_output_tokens_per_s_per_user"], r["summary"]["output_throughput"])
            for r in runs
        ]
        kept = [(p, r) for p, r in zip(points, runs, strict=True) if p[0] is not None]
        if not kept:
            continue
        xs, ys = zip(*(p for p, _ in kept), strict=True)
        axes.plot(xs, ys, marker="o", label=label)
        for (x, y), run in kept:
            axes.annotate(f"c={run['config']['concurrency'] or 'inf'}", (x, y), fontsize=7)
    axes.set_xlabel("median output tok/s per user (1 / TPOT)")
    axes.set_ylabel("output tok/s (all users)")
    axes.set_title("Throughput vs per-user speed")
    axes.grid(alpha=0.3)
    if by_label:
        axes.legend(fontsize=8)
    figure.savefig(path)
    return path


def _cdf(results, metric: str, xlabel: str, path: Path) -> Path:
    figure = _new_figure()
    axes = figure.add_subplot()
    for result in results:
        values = np.sort(_samples_ms(result, metric))
        if len(values):
            fraction = np.arange(0, len(values) + 1) / len(values)  # starts from 0
            values = np.concatenate([values[:1], values])
            axes.step(values, fraction, where="post", label=run_name(result))
    axes.set_xlabel(xlabel)
    axes.set_ylabel("fraction of samples")
    axes.set_title(f"{metric.upper()} distribution (successful requests)")
    axes.grid(alpha=0.3)
    if axes.lines:
        axes.legend(fontsize=8)
    figure.savefig(path)
    return path


def _samples_ms(result: dict[str, Any], metric: str) -> list[float]:
    done = [r for r in result["requests"] if r["success"]]
    if metric == "itl":
        return [gap * 1000.0 for r in done for gap in r["itl"]]
    return [r[metric] * 1000.0 for r in done if r[metric] is not None]
