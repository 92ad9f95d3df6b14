"""Where a fed decode step's time goes inside its CUDA graph, kernel by kernel (issue #8).

    python benchmarks/graph_timeline.py --model gpt-oss-20b --json timeline.json
    python benchmarks/graph_timeline.py --model gpt-oss-120b --batch 64   (a batch-64 step)

One model a process: CUPTI may collect nothing from graphs captured after a profiler session ran
(step_profile.py's profile_in_child), so a second model would be captured after the first's.

The model is built as decode_speed.py builds it (dummy weights, CUDA graphs, random KV, every
sequence at --context tokens) and runs decode_speed's fed loop (each step's greedy token fed on the
device) under torch.profiler. CUPTI reports the kernels inside each graph replay with their start
and end, so the step can be read as the chain it is. Kernels under PDL start before their
predecessor ends (their programs wait at `griddepcontrol.wait`), so a kernel's duration overstates
what it costs; the number that adds up to the step is its *end delta*: how much later it ends than
everything before it in the step. The end deltas of a step plus the idle time before its first
kernel sum to the step's period.

Per kernel name: calls a step, median duration, and end deltas (median a call, sum a step), and
at batch 1, for the parts whose bytes are known (QKV, O, router, the experts' GEMVs, the
unembedding), their byte floor a step (bytes / the copy bandwidth measured in the same run); the
step's period, the span inside the graph and the idle time between steps (graph launch, the input
copies and, without the graph's own greedy pick, the argmax) beside the unprofiled fed step from
decode_speed.py. Steps are cut at the embedding kernel, each step's first.

step_profile.py reads eager steps (launches serialized); this reads the graph as it runs.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_speed import BLOCK, fed_step, fill_random, make_seqs, timed_decode_fed  # noqa: E402
from throughput import load_dummy, run_info  # noqa: E402
from timing import copy_bandwidth  # noqa: E402

from gossamer.runner.model_runner import ModelRunner  # noqa: E402


@dataclass(frozen=True)
class Event:
    name: str
    start: float  # microseconds
    end: float


@dataclass
class KernelTimes:
    name: str
    calls_per_step: float
    median_us: float  # duration of one call, PDL wait included
    median_end_delta_us: float  # one call's end delta
    end_delta_us_per_step: float
    floor_us_per_step: float | None = None  # its bytes / the copy bandwidth, where known (`floors`)


# The batch-1 kernels whose bytes are known, by table row (`role`): the part of the step they read.
# The dense GEMV serves QKV (#0) and O (#1) in each layer, and the unembedding after the layers
# when gemv.TRITON_UNEMBED is on; cuBLAS's unembedding kernels are named by their library.
PART_OF_ROW = {
    "_gemv_dot_kernel #0": "qkv",
    "_gemv_dot_kernel #1": "o",
    "_gemv_dot_kernel (last)": "unembed",
    "_gemv_fma_kernel": "router",
    "_fp16_gate_up_kernel": "gate_up",
    "_fp16_down_kernel": "down",
}
CUBLAS_MARKS = ("gemv", "gemm", "nvjet", "cutlass")  # a cuBLAS kernel's name has one of these


def part_bytes(cfg) -> dict[str, float]:
    """Bytes a batch-1 step reads per part, all layers: bf16 dense weights, the top-k experts'
    MXFP4 words and scales (17 bytes a group of 32: 16 of codes, 1 scale), the unembedding."""
    hidden, inter, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    mxfp4 = 0.5 + 1 / 32  # bytes a weight
    top_k = cfg.num_experts_per_tok
    return {
        "qkv": 2 * layers * hidden * (cfg.q_size + 2 * cfg.kv_size),
        "o": 2 * layers * cfg.q_size * hidden,
        "router": 2 * layers * cfg.num_local_experts * hidden,
        "gate_up": layers * top_k * 2 * inter * hidden * mxfp4,
        "down": layers * top_k * hidden * inter * mxfp4,
        "unembed": 2 * cfg.vocab_size * hidden,
    }


def floors(table: list[dict], cfg, bandwidth: float) -> None:
    """Fill each known row's floor_us_per_step (in place). A cuBLAS row is the unembedding only
    while no Triton GEMV took it (one of the two, never both)."""
    parts = part_bytes(cfg)
    triton_unembed = any(row["name"] == "_gemv_dot_kernel (last)" for row in table)
    for row in table:
        part = PART_OF_ROW.get(row["name"])
        if part is None and not triton_unembed and any(m in row["name"] for m in CUBLAS_MARKS):
            part = "unembed"
        if part is not None:
            row["floor_us_per_step"] = parts[part] / bandwidth * 1e6


# A step's first kernel: the embedding (kernels/embed.py with the greedy pick in the graph, else
# torch's indexing kernel). The input upload before it ends the previous step.
STEP_MARKERS = ("_embed_kernel", "index_elementwise_kernel")


def split_steps(events: list[Event], markers: tuple[str, ...] = STEP_MARKERS) -> list[list[Event]]:
    """The events cut into steps, each starting at a kernel whose name contains the first of
    `markers` that the trace has. Events before the first step are dropped; the last step only
    ends the previous one's period."""
    ordered = sorted(events, key=lambda e: e.start)
    marker = next((m for m in markers if any(m in e.name for e in ordered)), markers[0])
    steps: list[list[Event]] = []
    for event in ordered:
        if marker in event.name:
            steps.append([])
        if steps:
            steps[-1].append(event)
    if len(steps) < 2:
        raise ValueError(f"{len(steps)} steps start with a {marker!r} kernel: two are needed")
    return steps


def keyed(step: list[Event]) -> list[tuple[str, int]]:
    """(name, its n-th call in the step) per event: steps whose copies or overlapped kernels start in
    another order still line up by key."""
    seen: dict[str, int] = defaultdict(int)
    keys = []
    for event in step:
        keys.append((event.name, seen[event.name]))
        seen[event.name] += 1
    return keys


def end_deltas(step: list[Event], step_start: float) -> list[float]:
    """Per event: how much later it ends than every earlier event of the step (the first event's is
    measured from `step_start`); 0 for an event that ends inside an earlier one's span."""
    deltas, latest = [], step_start
    for event in step:
        deltas.append(max(0.0, event.end - latest))
        latest = max(latest, event.end)
    return deltas


def role(name: str, call: int, calls: int, layers: int | None) -> str:
    """A kernel's row in the table: its name, and where it runs several times a layer (the dense
    GEMV serves QKV and O), which of those calls: "name #i" for the i-th call in each layer. Calls
    beyond a whole number per layer are taken to come after the layers (the final norm, a Triton
    unembedding): "name (last)"."""
    per_layer = calls // layers if layers else 0
    if per_layer == 0 or (per_layer == 1 and calls == layers):
        return name
    if call >= per_layer * layers:
        return f"{name} (last)"
    return f"{name} #{call % per_layer}" if per_layer > 1 else name


def timeline(steps: list[list[Event]], layers: int | None = None) -> dict:
    """Per-kernel medians over steps and the step's period, span and idle time between steps. The
    last step only ends the previous one's period: at least two steps are needed. With `layers`,
    a kernel called k times a layer gets k rows (`role`)."""
    measured = steps[:-1]
    periods = [nxt[0].start - cur[0].start for cur, nxt in zip(measured, steps[1:], strict=True)]
    spans = [max(e.end for e in step) - step[0].start for step in measured]
    # per (name, call) key: (duration, end delta) in every measured step; the first event's delta
    # is its own duration, so a step's deltas sum to its span
    samples: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    for step in measured:
        deltas = end_deltas(step, step[0].start)
        for key, event, delta in zip(keyed(step), step, deltas, strict=True):
            samples[key].append((event.end - event.start, delta))
    per_step = defaultdict(int)
    for name, _ in keyed(steps[0]):
        per_step[name] += 1
    calls: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for (name, call), times in samples.items():
        if 2 * len(times) < len(measured):
            continue  # a copy or kernel most steps do not have
        duration = statistics.median(d for d, _ in times)
        row = role(name, call, per_step[name], layers)
        calls[row].append((duration, statistics.median(x for _, x in times)))
    table = [
        KernelTimes(
            name,
            len(times),
            statistics.median(d for d, _ in times),
            statistics.median(x for _, x in times),
            sum(x for _, x in times),
        )
        for name, times in calls.items()
    ]
    table.sort(key=lambda row: -row.end_delta_us_per_step)
    period, span = statistics.median(periods), statistics.median(spans)
    return {
        "events_per_step": statistics.median(len(step) for step in measured),
        "period_us": period,
        "span_us": span,
        # between the last event's end and the next step's first start: the host's loop and the
        # graph launch, where they are not hidden behind the previous step
        "idle_us": period - span,
        "kernels": [asdict(row) for row in table],
    }


def device_events(prof) -> list[Event]:
    return [
        Event(e.name, e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
    ]


def profile_fed(runner: ModelRunner, seqs: list, steps: int) -> list[Event]:
    """decode_speed's fed loop under the profiler, after a few steps outside it."""
    ids = None
    for _ in range(3):
        ids = fed_step(runner, seqs, ids)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            ids = fed_step(runner, seqs, ids)
            for seq in seqs:
                seq.start += 1
        torch.cuda.synchronize()
    return device_events(prof)


def print_timeline(name: str, result: dict, top: int) -> None:
    print(
        f"\n{name}: fed step {result['fed_step_us']:.1f} us unprofiled; profiled period "
        f"{result['period_us']:.1f} us, {result['events_per_step']:.0f} events a step, span "
        f"{result['span_us']:.1f} us, idle between steps {result['idle_us']:.1f} us"
    )
    print(f"{'kernel':70s} calls  med us  med delta  delta/step  floor/step")
    for row in result["kernels"][:top]:
        floor = row.get("floor_us_per_step")
        print(
            f"{row['name'][:70]:70s} {row['calls_per_step']:5.0f} {row['median_us']:7.2f} "
            f"{row['median_end_delta_us']:10.2f} {row['end_delta_us_per_step']:11.1f} "
            f"{'' if floor is None else f'{floor:10.1f}'}"
        )


def bench_model(name: str, args: argparse.Namespace) -> dict:
    max_len = args.context + args.timed_steps + args.profile_steps + 32
    loaded = load_dummy(name, max_len)
    blocks = math.ceil(max_len / BLOCK)
    batch = args.batch
    runner = ModelRunner(
        loaded.model,
        num_blocks=1 + 2 * blocks * batch,
        block_size=BLOCK,
        max_num_seqs=batch,
        max_num_batched_tokens=batch,
        cuda_graphs=True,
        graph_sizes=(batch,),
    )
    fill_random(runner.kv_cache)  # random KV: reading it costs what a real context costs
    fed_s = timed_decode_fed(runner, make_seqs(batch, args.context, blocks), args.timed_steps)
    events = profile_fed(runner, make_seqs(batch, args.context, blocks), args.profile_steps)
    raw = {
        "model": Path(name).name,
        "batch": batch,
        "fed_step_us": fed_s * 1e6,
        "events": [asdict(e) for e in events],
    }
    if args.json:  # the raw events first: a trace the analysis refuses can be read again later
        Path(args.json).with_suffix(".events.json").write_text(json.dumps(raw))
    layers = loaded.config.num_hidden_layers
    result = {**timeline(split_steps(events), layers), "fed_step_us": fed_s * 1e6}
    result["copy_bandwidth_bytes_s"] = bandwidth = copy_bandwidth()
    if batch == 1:  # part_bytes counts a batch-1 step's reads
        floors(result["kernels"], loaded.config, bandwidth)
    print_timeline(f"{raw['model']} batch {batch}", result, args.top)
    return {"model": raw["model"], "batch": batch, **result}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="gpt-oss-20b")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=1, help="sequences a step (one graph size)")
    parser.add_argument("--profile-steps", type=int, default=8)
    parser.add_argument("--timed-steps", type=int, default=64)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("graph_timeline.py reads CUDA graph replays: it needs a GPU")
    out = {**run_info(args), "timeline": bench_model(args.model, args)}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
