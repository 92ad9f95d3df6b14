"""Where one decode step's time goes, kernel by kernel (issue #8).

    python benchmarks/step_profile.py                         # 120b and 20b, batch 1 and 64
    python benchmarks/step_profile.py --models gpt-oss-120b --batch-sizes 1 --json profile.json
    python benchmarks/step_profile.py --smoke                 # CPU: built-in mini model, CPU ops

The model is built as decode_speed.py builds it: dummy weights, a ModelRunner with CUDA graphs for
the batch sizes asked, random KV, every sequence at --context tokens. Per batch size:

1. a few eager decode steps (the same inputs, the graphs set aside) run under torch.profiler; the
   GPU kernels are grouped by name: calls per step, calls per layer (calls / num_hidden_layers),
   microseconds per call, per step and per layer (per step / num_hidden_layers), and share of the
   graph step. Memcpy and memset are counted apart from the kernel launches;
2. the CUDA-graph step is timed as decode_speed.timed_decode times it (fill inputs, replay, greedy
   pick, tokens to the host): that time minus the eager kernels' sum is "gaps + host", the idle
   GPU time between kernels inside the graph plus the host's share of the loop;
3. the graph steps are profiled too. Where the profiler sees the kernels inside a replay (CUPTI
   reports graph kernels on recent drivers), that gives the gaps without the eager stand-in.

The eager kernels are the graph's kernels with two differences: eager attention is sized from the
true context rather than the graph's max_model_len bound, and eager steps gather the logits rows
first. With --smoke on a CPU there is no graph: the table lists CPU ops by self time, and the step
time is the eager loop's.

On a GPU each model is profiled in a process of its own (CUPTI may collect nothing after a
profiler session that ran before a graph capture, and the next model's graphs are captured then).

Expected device time (H200, predicted, not yet measured): per model about 20 to 40 s of loading,
graph capture and the first eager steps compile the Triton kernels (up to a minute without a warm
cache), then a few seconds per batch size: 2 to 3 min for both models at batch 1 and 64.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from unittest import mock

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_speed import BLOCK, fill_random, make_seqs, timed_decode  # noqa: E402
from throughput import fill_defaults, load_dummy, run_info  # noqa: E402

from gossamer.engine.core import KV_CACHE_DTYPES, kv_cache_dtype  # noqa: E402
from gossamer.runner.model_runner import ModelRunner  # noqa: E402

COPY_PREFIXES = ("Memcpy", "Memset")  # how CUPTI names copies and fills
SMOKE = {"batch_sizes": "1,2", "context": 32, "timed_steps": 2, "profile_steps": 1}


@dataclass
class KernelRow:
    name: str
    calls_per_step: float
    calls_per_layer: float
    us_per_call: float
    us_per_step: float
    us_per_layer: float
    share_of_step: float  # of the graph step (the eager step on a CPU)


@dataclass
class Profile:
    """Device events of `steps` identical steps: kernels (CPU ops on a CPU) and copies."""

    kernels: list[tuple[str, float]]  # (name, microseconds)
    copies: list[tuple[str, float]]
    steps: int

    def per_step(self, events: list[tuple[str, float]]) -> tuple[float, float]:
        """(events per step, microseconds per step)."""
        return len(events) / self.steps, sum(us for _, us in events) / self.steps


def profile_steps(step: Callable[[], object], steps: int, on_gpu: bool) -> Profile:
    """Run `step` `steps` times under torch.profiler and keep the device's events."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if on_gpu:
            torch.cuda.synchronize()
    if on_gpu:
        events = [
            (e.name, e.time_range.elapsed_us())
            for e in prof.events()
            # a user annotation projected onto the GPU spans kernels: not one of them
            if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
        ]
    else:  # self time, so that an op and the ops it calls are not counted twice
        events = [(e.name, e.self_cpu_time_total) for e in prof.events()]
    kernels = [(name, us) for name, us in events if not name.startswith(COPY_PREFIXES)]
    copies = [(name, us) for name, us in events if name.startswith(COPY_PREFIXES)]
    return Profile(kernels, copies, steps)


def kernel_table(prof: Profile, num_layers: int, step_us: float) -> list[KernelRow]:
    """Kernels grouped by name, the most time per step first."""
    times: dict[str, list[float]] = defaultdict(list)
    for name, us in prof.kernels + prof.copies:
        times[name].append(us)
    rows = []
    for name, calls in times.items():
        per_step = sum(calls) / prof.steps
        rows.append(
            KernelRow(
                name,
                len(calls) / prof.steps,
                len(calls) / prof.steps / num_layers,
                sum(calls) / len(calls),
                per_step,
                per_step / num_layers,
                per_step / step_us,
            )
        )
    return sorted(rows, key=lambda row: -row.us_per_step)


@contextmanager
def eager(runner: ModelRunner) -> Iterator[None]:
    """Set the captured graphs aside, so that every step launches its kernels one by one."""
    graphs, runner.graphs = runner.graphs, {}
    try:
        yield
    finally:
        runner.graphs = graphs


def step_seconds(runner: ModelRunner, seqs, steps: int) -> float:
    """decode_speed.timed_decode; on a CPU (smoke runs) without its CUDA synchronisation."""
    if runner.device.type == "cuda":
        return timed_decode(runner, seqs, steps)
    with mock.patch.object(torch.cuda, "synchronize", lambda: None):
        return timed_decode(runner, seqs, steps)


def greedy_step(runner: ModelRunner, seqs: list) -> None:
    """One decode step as the engine runs it: the host reads the sampled tokens."""
    runner.run(seqs).argmax(-1).tolist()


def profile_batch(runner: ModelRunner, name: str, batch: int, args) -> dict:
    """Eager kernels of one step beside the timed graph step (the graph's own profile apart)."""
    on_gpu = runner.device.type == "cuda"
    num_layers = runner.model.config.num_hidden_layers
    blocks_per_seq = math.ceil(args.max_len / BLOCK)
    step = partial(greedy_step, runner, make_seqs(batch, args.context, blocks_per_seq))
    with eager(runner):
        eager_us = 1e6 * step_seconds(runner, make_seqs(batch, args.context, blocks_per_seq), 3)
        eager_prof = profile_steps(step, args.profile_steps, on_gpu)
    if on_gpu and not eager_prof.kernels:
        raise RuntimeError(
            "the profiler saw no GPU kernels (CUPTI can stop collecting after a session that ran "
            "before a graph capture): profile one model per process"
        )
    timed_seqs = make_seqs(batch, args.context, blocks_per_seq)
    graph_us = 1e6 * step_seconds(runner, timed_seqs, args.timed_steps)
    launches, kernel_us = eager_prof.per_step(eager_prof.kernels)
    copies, copy_us = eager_prof.per_step(eager_prof.copies)
    return {
        "model": name,
        "batch": batch,
        "context": args.context,
        "num_layers": num_layers,
        "step_timing": "cuda graph replay" if runner.graphs else "eager (no graphs)",
        "event_unit": "GPU kernels" if on_gpu else "CPU ops, self time",
        "step_us": graph_us,
        "eager_step_us": eager_us,
        "launches_per_step": launches,
        "kernel_us_per_step": kernel_us,
        "copies_per_step": copies,
        "copy_us_per_step": copy_us,
        "gaps_and_host_us": graph_us - kernel_us - copy_us,
        "kernels": [asdict(row) for row in kernel_table(eager_prof, num_layers, graph_us)],
        "graph_profile": None,
    }


def graph_profile(step: Callable[[], object], steps: int, graph_us: float) -> dict:
    """The graph steps' own events; launches_per_step 0 means the profiler saw none inside."""
    prof = profile_steps(step, steps, on_gpu=True)
    launches, kernel_us = prof.per_step(prof.kernels)
    _, copy_us = prof.per_step(prof.copies)
    return {
        "launches_per_step": launches,
        "kernel_us_per_step": kernel_us,
        "copy_us_per_step": copy_us,
        "gaps_and_host_us": graph_us - kernel_us - copy_us if launches else None,
    }


def print_profile(result: dict, top: int) -> None:
    step_us = result["step_us"]
    print(
        f"\n{result['model']} batch {result['batch']}, context {result['context']}: step "
        f"{step_us / 1e3:.3f} ms ({result['step_timing']}), eager {result['eager_step_us'] / 1e3:.2f}"
        f" ms; {result['launches_per_step']:.0f} {result['event_unit']} per step, "
        f"{result['kernel_us_per_step'] / 1e3:.3f} ms, {result['copies_per_step']:.0f} copies "
        f"{result['copy_us_per_step']:.0f} us; gaps + host {result['gaps_and_host_us'] / 1e3:.3f} ms"
    )
    print(f"{'kernel':60s} calls/step calls/layer  us/call  us/step us/layer  %step")
    rows = result["kernels"]
    for row in rows[:top]:
        print(
            f"{row['name'][:60]:60s} {row['calls_per_step']:10.1f} {row['calls_per_layer']:11.2f} "
            f"{row['us_per_call']:8.2f} {row['us_per_step']:8.1f} {row['us_per_layer']:8.2f} "
            f"{100 * row['share_of_step']:5.1f}%"
        )
    rest = rows[top:]
    if rest:
        us = sum(row["us_per_step"] for row in rest)
        print(f"{f'({len(rest)} more)':60s} {'':10s} {'':11s} {'':8s} {us:8.1f}")
    gaps = result["gaps_and_host_us"]
    print(
        f"{'gaps + host':60s} {'':10s} {'':11s} {'':8s} {gaps:8.1f} {'':8s} {100 * gaps / step_us:5.1f}%"
    )


def print_graph_profile(graph: dict) -> None:
    if not graph["launches_per_step"]:
        print("inside the graph: the profiler saw no kernels of the replays")
        return
    print(
        f"inside the graph: {graph['launches_per_step']:.0f} kernels per step, "
        f"{graph['kernel_us_per_step'] / 1e3:.3f} ms, copies {graph['copy_us_per_step']:.0f} us;"
        f" gaps + host {graph['gaps_and_host_us'] / 1e3:.3f} ms"
    )


def bench_model(name: str, args: argparse.Namespace) -> list[dict]:
    loaded = load_dummy(name, args.max_len, args.ops)
    biggest = max(args.batch_sizes)
    runner = ModelRunner(
        loaded.model,
        num_blocks=1 + 2 * biggest * math.ceil(args.max_len / BLOCK),
        block_size=BLOCK,
        max_num_seqs=biggest,
        max_num_batched_tokens=biggest,
        cuda_graphs=not args.no_cuda_graphs,
        graph_sizes=tuple(args.batch_sizes),
        kv_cache_dtype=kv_cache_dtype(args.kv_cache_dtype, loaded.model.dtype, loaded.model.device),
    )
    fill_random(runner.kv_cache)  # random KV: reading it costs what a real context costs
    results = []
    for batch in args.batch_sizes:
        result = profile_batch(runner, Path(name).name, batch, args)
        print_profile(result, args.top)  # before the graph session, in case that one fails
        if runner.graphs and not args.no_graph_profile:
            seqs = make_seqs(batch, args.context, math.ceil(args.max_len / BLOCK))
            step = partial(greedy_step, runner, seqs)
            result["graph_profile"] = graph_profile(step, args.profile_steps, result["step_us"])
            print_graph_profile(result["graph_profile"])
        results.append(result)
    del runner, loaded
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default=None, help="default gpt-oss-120b,gpt-oss-20b")
    parser.add_argument("--batch-sizes", default=None, help="default 1,64")
    parser.add_argument("--context", type=int, default=None, help="default 1024")
    parser.add_argument("--profile-steps", type=int, default=None, help="default 5")
    parser.add_argument("--timed-steps", type=int, default=None, help="default 64")
    parser.add_argument("--top", type=int, default=30, help="kernels printed (the JSON has all)")
    parser.add_argument("--ops", default="auto")
    parser.add_argument("--no-cuda-graphs", action="store_true")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", *KV_CACHE_DTYPES])
    parser.add_argument(
        "--no-graph-profile", action="store_true", help="skip profiling the graph replays"
    )
    parser.add_argument("--smoke", action="store_true", help="mini model, tiny shapes (CPU)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    defaults = {"batch_sizes": "1,64", "context": 1024, "profile_steps": 5, "timed_steps": 64}
    fill_defaults(args, defaults, SMOKE)
    args.batch_sizes = [int(b) for b in str(args.batch_sizes).split(",")]
    # as decode_speed.py sizes it: the timed steps advance the context
    args.max_len = args.context + args.timed_steps + 16
    return args


def profile_in_child(name: str, args: argparse.Namespace) -> list[dict]:
    """Profile one model in a process of its own: a profiler session that ran before a CUDA-graph
    capture can leave CUPTI collecting no kernels for the rest of the process, so the next model's
    graphs must not be captured where the previous model was profiled."""
    flags = [
        *("--models", name, "--batch-sizes", ",".join(map(str, args.batch_sizes))),
        *("--context", str(args.context), "--profile-steps", str(args.profile_steps)),
        *("--timed-steps", str(args.timed_steps), "--top", str(args.top), "--ops", args.ops),
        *(["--no-cuda-graphs"] if args.no_cuda_graphs else []),
        *(["--no-graph-profile"] if args.no_graph_profile else []),
    ]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "profile.json"
        child = subprocess.run([sys.executable, __file__, *flags, "--json", str(path)])
        if child.returncode or not path.is_file():
            print(f"{name}: the profile run failed (exit {child.returncode})", flush=True)
            return []
        return json.loads(path.read_text())["profiles"]


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if torch.cuda.is_available() and len(args.models) > 1:
        results = [row for name in args.models for row in profile_in_child(name, args)]
    else:
        results = [row for name in args.models for row in bench_model(name, args)]
    result = {**run_info(args), "profiles": results}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
