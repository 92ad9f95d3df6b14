"""GPU timing shared by the benchmark scripts: CUDA events, medians, graphs, copy bandwidth."""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable

import torch


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of fn on the GPU, measured with CUDA events after one warm-up call."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def graph_seconds_per_call(calls: list[Callable[[], object]], repeats: int = 10) -> float:
    """Median time of one call when `calls` run back to back in one CUDA graph: launch gaps as in
    the model's decode graph, no Python in the loop."""
    for call in calls:  # compile and warm every launch before the capture
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    seconds = median_seconds(graph.replay, repeats) / len(calls)
    del graph
    return seconds


def copy_bandwidth(gib: int = 2, device: str = "cuda") -> float:
    """Bytes/s of a large device-to-device copy, counting the read and the write: the ceiling
    every byte floor is divided by."""
    src = torch.empty(gib << 30, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    seconds = median_seconds(functools.partial(dst.copy_, src), repeats=10)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * (gib << 30) / seconds
